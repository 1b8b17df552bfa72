"""a reply keeps its turn's report: what the prompt held and how its memories scored

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08 09:00:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('turn_report', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_column('turn_report')
