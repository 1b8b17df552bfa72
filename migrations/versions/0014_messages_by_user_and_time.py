"""a user's messages are indexed by their time (user, created_at): the turns said in a span a query names

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-10 12:00:00
"""
from collections.abc import Sequence

from alembic import op


revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index(
            'ix_messages_user_pk_created_at', ['user_pk', 'created_at'], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_user_pk_created_at')
