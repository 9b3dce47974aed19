"""retire: a sink retired by ``eosink retire`` (its highest epoch, when, by whom)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # `eosink retire` deletes a sink's epochs and keeps its row as the record of the
    # retirement: a later run under the same sink_id starts above retired_high (Iceberg
    # snapshot summaries and Kafka's committed records cannot be deleted). NULL: never retired.
    with op.batch_alter_table("eosink_sink") as t:
        t.add_column(sa.Column("retired_high", sa.BigInteger, nullable=True))
        t.add_column(sa.Column("retired_at", sa.Float, nullable=True))
        t.add_column(sa.Column("retired_by", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eosink_sink") as t:
        t.drop_column("retired_by")
        t.drop_column("retired_at")
        t.drop_column("retired_high")
