"""key facts and their history

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 03:40:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    with op.batch_alter_table('users') as batch:
        batch.add_column(
            sa.Column('facts_through_message_id', BigId, server_default='0', nullable=False)
        )
    op.create_table('facts',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('user_pk', BigId, nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('category', sa.String(length=32), nullable=False),
    sa.Column('subject', sa.String(length=255), nullable=True),
    sa.Column('value', sa.Text(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('is_pinned', sa.Boolean(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('valid_from', sa.DateTime(timezone=True), nullable=False),
    sa.Column('valid_to', sa.DateTime(timezone=True), nullable=True),
    sa.Column('source_message_ids', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=True),
    sa.Column('vector', sa.LargeBinary(), nullable=True),
    sa.ForeignKeyConstraint(['user_pk'], ['users.id'], name=op.f('fk_facts_user_pk_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_facts'))
    )
    op.create_index('ix_facts_user_pk_status', 'facts', ['user_pk', 'status'], unique=False)
    op.create_table('fact_changes',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('fact_id', BigId, nullable=False),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('before', sa.JSON(), nullable=True),
    sa.Column('after', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['fact_id'], ['facts.id'], name=op.f('fk_fact_changes_fact_id_facts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_fact_changes'))
    )
    op.create_index(op.f('ix_fact_changes_fact_id'), 'fact_changes', ['fact_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_fact_changes_fact_id'), table_name='fact_changes')
    op.drop_table('fact_changes')
    op.drop_index('ix_facts_user_pk_status', table_name='facts')
    op.drop_table('facts')
    with op.batch_alter_table('users') as batch:
        batch.drop_column('facts_through_message_id')
