"""a message may hold one vector per model: MiniLM's and a multilingual model's

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 06:00:00
"""
from collections.abc import Sequence

from alembic import op


revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('message_embeddings', recreate='always') as batch:
        batch.drop_constraint('pk_message_embeddings', type_='primary')
        batch.create_primary_key('pk_message_embeddings', ['message_id', 'model'])


def downgrade() -> None:
    # One vector per message again: the first model's (by name) of each message is kept.
    op.execute(
        "DELETE FROM message_embeddings WHERE EXISTS (SELECT 1 FROM message_embeddings AS o "
        "WHERE o.message_id = message_embeddings.message_id AND o.model < message_embeddings.model)"
    )
    with op.batch_alter_table('message_embeddings', recreate='always') as batch:
        batch.drop_constraint('pk_message_embeddings', type_='primary')
        batch.create_primary_key('pk_message_embeddings', ['message_id'])
