"""a user's sessions are indexed in their listed order (user, time, id), for pages of them

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-09 09:00:00
"""
from collections.abc import Sequence

from alembic import op


revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.create_index(
            'ix_chat_sessions_user_pk_created_at_id', ['user_pk', 'created_at', 'id'], unique=False
        )
        batch_op.drop_index(batch_op.f('ix_chat_sessions_user_pk'))


def downgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chat_sessions_user_pk'), ['user_pk'], unique=False)
        batch_op.drop_index('ix_chat_sessions_user_pk_created_at_id')
