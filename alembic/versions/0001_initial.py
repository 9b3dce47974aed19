"""initial meta store: eosink_sink and pending_sink_state

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eosink_sink",
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("plugin", sa.String(128), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("owner", sa.String(256), nullable=False, server_default=""),
        sa.Column("lineage", sa.String(64), nullable=True),
        sa.Column("epoch_base", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("high_water", sa.BigInteger, nullable=False, server_default="-1"),
        sa.Column("committed_epochs", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("arrow_schema", sa.LargeBinary, nullable=True),
        sa.Column("options_json", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "pending_sink_state",
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("committable", sa.LargeBinary, nullable=True),
        sa.Column("codec_version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("files", sa.Integer, nullable=False, server_default="0"),
        sa.Column("bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("batch_end_at", sa.Float, nullable=True),
        sa.Column("pre_commit_ms", sa.Float, nullable=True),
        sa.Column("commit_ms", sa.Float, nullable=True),
        sa.Column("committed_at", sa.Float, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_pending_sink_state_status", "pending_sink_state", ["status"])


def downgrade() -> None:
    op.drop_index("ix_pending_sink_state_status", table_name="pending_sink_state")
    op.drop_table("pending_sink_state")
    op.drop_table("eosink_sink")
