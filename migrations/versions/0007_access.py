"""tenants, API keys, the audit log; users and knowledge belong to a tenant

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 07:00:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'tenants',
        sa.Column('id', BigId, autoincrement=True, nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
        sa.UniqueConstraint('name', name=op.f('uq_tenants_name')),
    )
    op.execute(
        "INSERT INTO tenants (id, name, created_at) VALUES (1, 'default', CURRENT_TIMESTAMP)"
    )
    if op.get_bind().dialect.name == 'postgresql':
        # The explicit id 1 above did not advance the sequence.
        op.execute("SELECT setval(pg_get_serial_sequence('tenants', 'id'), 1)")
    op.create_table(
        'api_keys',
        sa.Column('id', BigId, autoincrement=True, nullable=False),
        sa.Column('tenant_id', BigId, nullable=False),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('prefix', sa.String(length=16), nullable=False),
        sa.Column('key_hash', sa.String(length=64), nullable=False),
        sa.Column('is_admin', sa.Boolean(), nullable=False),
        sa.Column('requests_per_minute', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
        sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash')),
    )
    with op.batch_alter_table('api_keys') as batch:
        batch.create_index(batch.f('ix_api_keys_tenant_id'), ['tenant_id'], unique=False)
    op.create_table(
        'audit_log',
        sa.Column('id', BigId, autoincrement=True, nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(length=300), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('target', sa.String(length=300), nullable=False),
        sa.Column('detail', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log')),
    )
    # On SQLite these rebuild the tables (storage.migrate turns foreign keys off first, so
    # that dropping the old `users` table does not cascade into every user's rows).
    with op.batch_alter_table('users') as batch:
        batch.add_column(sa.Column('tenant_id', BigId, server_default='1', nullable=False))
        batch.drop_constraint('uq_users_external_id', type_='unique')
        batch.create_unique_constraint(
            batch.f('uq_users_tenant_id_external_id'), ['tenant_id', 'external_id']
        )
        batch.create_foreign_key(
            batch.f('fk_users_tenant_id_tenants'), 'tenants', ['tenant_id'], ['id'],
            ondelete='CASCADE',
        )
    with op.batch_alter_table('knowledge_documents') as batch:
        batch.add_column(sa.Column('tenant_id', BigId, server_default='1', nullable=False))
        batch.create_index(
            batch.f('ix_knowledge_documents_tenant_id'), ['tenant_id'], unique=False
        )
        batch.create_foreign_key(
            batch.f('fk_knowledge_documents_tenant_id_tenants'), 'tenants', ['tenant_id'],
            ['id'], ondelete='CASCADE',
        )
    op.execute("UPDATE knowledge_documents SET scope = 'tenant:1' WHERE scope = 'shared'")


def downgrade() -> None:
    op.execute("DELETE FROM knowledge_documents WHERE tenant_id <> 1")
    op.execute("UPDATE knowledge_documents SET scope = 'shared' WHERE scope = 'tenant:1'")
    with op.batch_alter_table('knowledge_documents') as batch:
        batch.drop_constraint('fk_knowledge_documents_tenant_id_tenants', type_='foreignkey')
        batch.drop_index(batch.f('ix_knowledge_documents_tenant_id'))
        batch.drop_column('tenant_id')
    # Users of other tenants cannot survive a schema where external ids are global.
    op.execute("DELETE FROM users WHERE tenant_id <> 1")
    with op.batch_alter_table('users') as batch:
        batch.drop_constraint('fk_users_tenant_id_tenants', type_='foreignkey')
        batch.drop_constraint('uq_users_tenant_id_external_id', type_='unique')
        batch.create_unique_constraint(batch.f('uq_users_external_id'), ['external_id'])
        batch.drop_column('tenant_id')
    op.drop_table('audit_log')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_index(batch.f('ix_api_keys_tenant_id'))
    op.drop_table('api_keys')
    op.drop_table('tenants')
