"""rolling session summaries and window state

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 03:45:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('session_summaries',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=36), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('through_seq', sa.Integer(), nullable=False),
    sa.Column('pruned_seqs', sa.JSON(), nullable=False),
    sa.Column('pinned_fact_ids', sa.JSON(), nullable=True),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('summarizer', sa.String(length=64), nullable=False),
    sa.Column('token_count', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], name=op.f('fk_session_summaries_session_id_chat_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_session_summaries')),
    sa.UniqueConstraint('session_id', 'version', name=op.f('uq_session_summaries_session_id_version'))
    )


def downgrade() -> None:
    op.drop_table('session_summaries')
