"""operations: the last error of each sink, and epochs abandoned as known losses

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eosink_sink") as t:
        t.add_column(sa.Column("last_error", sa.Text, nullable=True))
        t.add_column(sa.Column("last_error_at", sa.Float, nullable=True))
    # An epoch an operator abandoned (`eosink abandon --accept-data-loss`): kept forever.
    op.create_table(
        "eosink_loss",
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("origin", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("recorded_by", sa.String(256), nullable=False),
        sa.Column("recorded_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("eosink_loss")
    with op.batch_alter_table("eosink_sink") as t:
        t.drop_column("last_error_at")
        t.drop_column("last_error")
