"""Tables of `streamrl serve-training` (the Tinker-compatible training service), in the
ledger's PostgreSQL beside the run tables.

Every accepted request is a row before its future is answered, with its payload, so a
restarted service finishes what it accepted and answers for it; a training request's id
is `MODEL:SEQ` (the client's per-model sequence number), so a resubmitted request is the
same row and never runs twice. `service_models.applied_seq` is the last request whose
effect is in the model's durable state (`state_path`): after a crash the service loads
that state and runs again only what came after it.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Index, Integer, LargeBinary, MetaData, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB

service_metadata = MetaData()

service_api_keys = Table(
    "service_api_keys",
    service_metadata,
    Column("key_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("key_sha256", Text, nullable=False, unique=True),  # the key itself is never stored
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
)

service_sessions = Table(
    "service_sessions",
    service_metadata,
    Column("session_id", Text, primary_key=True),
    Column("key_id", Text, nullable=False),
    Column("sdk_version", Text),
    Column("user_metadata", JSONB),
    Column("status", Text, nullable=False, server_default="active"),  # active | finished
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
)

service_models = Table(
    "service_models",
    service_metadata,
    Column("model_id", Text, primary_key=True),
    Column("session_id", Text, nullable=False),
    Column("base_model", Text, nullable=False),
    Column("lora_rank", Integer),  # null: full fine-tuning
    Column("lora", JSONB),  # the client's LoraConfig (rank, seed, train_attn / train_mlp / train_unembed)
    Column("seed", Integer),
    Column("loaded_from", Text),  # a tinker:// state path the model started from
    Column("applied_seq", Integer, nullable=False, server_default="0"),
    Column("optim_steps", Integer, nullable=False, server_default="0"),
    Column("state_path", Text),  # the durable state holding everything up to applied_seq
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

service_requests = Table(
    "service_requests",
    service_metadata,
    Column("request_id", Text, primary_key=True),
    Column("model_id", Text),
    Column("seq_id", Integer),
    Column("kind", Text, nullable=False),  # forward_backward | forward | optim_step | save_weights | ...
    Column("payload", LargeBinary, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),  # pending | complete | failed
    Column("result", LargeBinary),
    Column("result_format", Text),  # proto | json
    Column("error", Text),
    Column("error_category", Text),
    Column("runs", Integer, nullable=False, server_default="0"),  # executions (a replay after a crash adds one)
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("completed_at", DateTime(timezone=True)),
    Index("service_requests_model_seq", "model_id", "seq_id"),
    Index("service_requests_pending", "status"),
)

service_checkpoints = Table(
    "service_checkpoints",
    service_metadata,
    Column("path", Text, primary_key=True),  # tinker://MODEL/weights/NAME or .../sampler_weights/NAME
    Column("model_id", Text, nullable=False),
    Column("kind", Text, nullable=False),  # state | sampler
    Column("folder", Text, nullable=False),
    Column("seq_id", Integer),
    Column("bytes", BigInteger),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
