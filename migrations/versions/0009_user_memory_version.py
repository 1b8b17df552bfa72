"""a change counter per user: processes catch their derived indexes up from SQL

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 08:00:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    with op.batch_alter_table('users') as batch:
        batch.add_column(
            sa.Column('memory_version', BigId, server_default='0', nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table('users') as batch:
        batch.drop_column('memory_version')
