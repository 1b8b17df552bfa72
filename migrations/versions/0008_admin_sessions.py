"""admin page sessions (the cookie no longer holds the key); the readiness write probe

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'admin_sessions',
        sa.Column('id', BigId, autoincrement=True, nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('key_id', BigId, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['key_id'], ['api_keys.id'], name=op.f('fk_admin_sessions_key_id_api_keys'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_admin_sessions')),
        sa.UniqueConstraint('token_hash', name=op.f('uq_admin_sessions_token_hash')),
    )
    with op.batch_alter_table('admin_sessions') as batch:
        batch.create_index(batch.f('ix_admin_sessions_key_id'), ['key_id'], unique=False)
    op.create_table(
        'readiness_probe',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('checked_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_readiness_probe')),
    )
    op.execute("INSERT INTO readiness_probe (id, checked_at) VALUES (1, CURRENT_TIMESTAMP)")


def downgrade() -> None:
    op.drop_table('readiness_probe')
    with op.batch_alter_table('admin_sessions') as batch:
        batch.drop_index(batch.f('ix_admin_sessions_key_id'))
    op.drop_table('admin_sessions')
