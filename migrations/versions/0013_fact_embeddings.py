"""facts' vectors by a second model (the multilingual dense list), one row per fact and model

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10 09:00:00
"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('fact_embeddings',
    sa.Column('fact_id', BIG_ID, nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('vector', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['fact_id'], ['facts.id'], name=op.f('fk_fact_embeddings_fact_id_facts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('fact_id', 'model', name=op.f('pk_fact_embeddings'))
    )


def downgrade() -> None:
    op.drop_table('fact_embeddings')
