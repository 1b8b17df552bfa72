"""per-turn context kept with each user message

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 05:05:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.add_column(sa.Column('context_note', sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column('context_note_tokens', sa.Integer(), server_default='0', nullable=False)
        )
        batch.add_column(sa.Column('context_note_ids', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('context_note_fact_ids', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.drop_column('context_note_fact_ids')
        batch.drop_column('context_note_ids')
        batch.drop_column('context_note_tokens')
        batch.drop_column('context_note')
