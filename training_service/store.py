"""What `streamrl serve-training` keeps in PostgreSQL (tables in schema/service.py):
API keys (hashed), sessions, models, every accepted request with its payload and result,
and checkpoints. All of it survives a restart of the service."""

from __future__ import annotations

import hashlib
import json
import secrets

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from streamrl.runtime.db import engine
from streamrl.schema.service import (
    service_api_keys,
    service_checkpoints,
    service_models,
    service_requests,
    service_sessions,
)

KEY_PREFIX = "tml-"  # the official client accepts only keys of this form


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ServiceStore:
    def __init__(self, database_url: str):
        self.engine = engine(database_url)

    # --- API keys ------------------------------------------------------------------------------
    def create_key(self, name: str) -> tuple[str, str]:
        """A new key: (key_id, key). The key is shown once; only its digest is stored."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = "key-" + secrets.token_hex(6)
        with self.engine.begin() as conn:
            conn.execute(insert(service_api_keys).values(key_id=key_id, name=name, key_sha256=key_digest(key)))
        return key_id, key

    def key_id_for(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                select(service_api_keys.c.key_id).where(
                    and_(service_api_keys.c.key_sha256 == key_digest(key), service_api_keys.c.revoked_at.is_(None))
                )
            ).scalar()

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key and end its work, in one transaction: its open sessions finish (a
        running service drops their models within a second, a restarted one never loads
        them) and its requests not yet run fail, saying why."""
        with self.engine.begin() as conn:
            revoked = conn.execute(
                update(service_api_keys).where(service_api_keys.c.key_id == key_id).values(revoked_at=func.now())
            ).rowcount
            if revoked != 1:
                return False
            sessions = select(service_sessions.c.session_id).where(service_sessions.c.key_id == key_id)
            models = select(service_models.c.model_id).where(service_models.c.session_id.in_(sessions))
            conn.execute(
                update(service_sessions)
                .where(and_(service_sessions.c.key_id == key_id, service_sessions.c.status == "active"))
                .values(status="finished", finished_at=func.now())
            )
            conn.execute(
                update(service_requests)
                .where(
                    and_(
                        service_requests.c.status == "pending",
                        service_requests.c.model_id.in_(models) | service_requests.c.request_id.like(f"sample-{key_id}-%"),
                    )
                )
                .values(status="failed", error="the API key was revoked", error_category="user", completed_at=func.now())
            )
            return True

    def keys(self) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    service_api_keys.c.key_id,
                    service_api_keys.c.name,
                    service_api_keys.c.created_at,
                    service_api_keys.c.revoked_at,
                ).order_by(service_api_keys.c.created_at)
            )
            return [dict(r._mapping) for r in rows]

    # --- sessions and models -----------------------------------------------------------------------
    def add_session(self, session_id: str, key_id: str, sdk_version: str | None, user_metadata: dict) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(service_sessions).values(
                    session_id=session_id, key_id=key_id, sdk_version=sdk_version, user_metadata=user_metadata
                )
            )

    def session_key(self, session_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(service_sessions.c.key_id).where(service_sessions.c.session_id == session_id)).scalar()

    def finish_session(self, session_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(service_sessions)
                .where(service_sessions.c.session_id == session_id)
                .values(status="finished", finished_at=func.now())
            )

    def add_model(self, **row) -> None:
        with self.engine.begin() as conn:
            conn.execute(pg_insert(service_models).values(**row).on_conflict_do_nothing())

    def model(self, model_id: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(service_models).where(service_models.c.model_id == model_id)).first()
            return dict(row._mapping) if row else None

    def models_to_restore(self) -> list[dict]:
        """Models of sessions still open: what a restarted service loads again."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(service_models)
                .join(service_sessions, service_sessions.c.session_id == service_models.c.session_id)
                .where(service_sessions.c.status == "active")
                .order_by(service_models.c.created_at)
            )
            return [dict(r._mapping) for r in rows]

    def key_usage(self, key_id: str) -> dict[str, int]:
        """What a key holds now: its open sessions, their models, and its requests accepted
        and not run (its models' and its sample requests, `sample-KEY-...`). A finished
        session and its models no longer count: a limit bounds what is live, not what a
        key ever made."""
        with self.engine.connect() as conn:
            sessions = select(service_sessions.c.session_id).where(
                and_(service_sessions.c.key_id == key_id, service_sessions.c.status == "active")
            )
            every_session = select(service_sessions.c.session_id).where(service_sessions.c.key_id == key_id)
            models = select(service_models.c.model_id).where(service_models.c.session_id.in_(sessions))
            every_model = select(service_models.c.model_id).where(service_models.c.session_id.in_(every_session))
            count = func.count()
            return {
                "sessions": conn.execute(select(count).select_from(sessions.subquery())).scalar() or 0,
                "models": conn.execute(select(count).select_from(models.subquery())).scalar() or 0,
                "pending": conn.execute(
                    select(count)
                    .select_from(service_requests)
                    .where(
                        and_(
                            service_requests.c.status == "pending",
                            service_requests.c.model_id.in_(every_model)
                            | service_requests.c.request_id.like(f"sample-{key_id}-%"),
                        )
                    )
                ).scalar()
                or 0,
            }

    # --- requests ----------------------------------------------------------------------------------------
    def accept(self, request_id: str, kind: str, payload: bytes, model_id: str | None = None, seq_id: int | None = None) -> None:
        """Record a request before its future is answered; a resubmitted one is the same row."""
        with self.engine.begin() as conn:
            conn.execute(
                pg_insert(service_requests)
                .values(request_id=request_id, kind=kind, payload=payload, model_id=model_id, seq_id=seq_id)
                .on_conflict_do_nothing()
            )

    def add_sampling_session(self, session_id: str, folder: str, base_model: str, model_path: str | None) -> None:
        """A sampling session is a completed request row holding what it samples from."""
        self.accept(
            session_id,
            "sampling_session",
            json.dumps({"folder": folder, "base_model": base_model, "model_path": model_path}).encode(),
        )
        self.finish(session_id, None, None)

    def request(self, request_id: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(service_requests).where(service_requests.c.request_id == request_id)).first()
            return dict(row._mapping) if row else None

    def request_at(self, model_id: str, seq_id: int) -> dict | None:
        """A model's request by its sequence number, while the model's session is open."""
        open_sessions = select(service_sessions.c.session_id).where(service_sessions.c.status == "active")
        with self.engine.connect() as conn:
            row = conn.execute(
                select(service_requests)
                .join(service_models, service_models.c.model_id == service_requests.c.model_id)
                .where(
                    and_(
                        service_requests.c.model_id == model_id,
                        service_requests.c.seq_id == seq_id,
                        service_models.c.session_id.in_(open_sessions),
                    )
                )
            ).first()
            return dict(row._mapping) if row else None

    def open_models(self, model_ids: list[str]) -> set[str]:
        """Those of `model_ids` whose session is still open (not finished, its key not revoked)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(service_models.c.model_id)
                .join(service_sessions, service_sessions.c.session_id == service_models.c.session_id)
                .where(and_(service_models.c.model_id.in_(model_ids), service_sessions.c.status == "active"))
            )
            return {row[0] for row in rows}

    def pending(self, kinds: tuple[str, ...]) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(service_requests)
                .where(and_(service_requests.c.status == "pending", service_requests.c.kind.in_(kinds)))
                .order_by(service_requests.c.created_at)
            )
            return [dict(r._mapping) for r in rows]

    def finish(
        self,
        request_id: str,
        result: bytes | None,
        result_format: str | None,
        error: str | None = None,
        category: str | None = None,
        model_update: dict | None = None,
    ) -> None:
        """A request's outcome; with `model_update`, the model's row changes in the same
        transaction (an optimizer step and the state that holds it commit together)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(service_requests)
                .where(service_requests.c.request_id == request_id)
                .values(
                    status="failed" if error else "complete",
                    result=result,
                    result_format=result_format,
                    error=error,
                    error_category=category,
                    completed_at=func.now(),
                    runs=service_requests.c.runs + 1,
                )
            )
            if model_update:
                model_id = model_update.pop("model_id")
                conn.execute(update(service_models).where(service_models.c.model_id == model_id).values(**model_update))

    def count_run(self, request_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(service_requests)
                .where(service_requests.c.request_id == request_id)
                .values(runs=service_requests.c.runs + 1)
            )

    # --- checkpoints ---------------------------------------------------------------------------------------
    def add_checkpoint(self, path: str, model_id: str, kind: str, folder: str, seq_id: int | None, size: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                pg_insert(service_checkpoints)
                .values(path=path, model_id=model_id, kind=kind, folder=folder, seq_id=seq_id, bytes=size)
                .on_conflict_do_update(index_elements=["path"], set_={"folder": folder, "seq_id": seq_id})
            )

    def checkpoint(self, path: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(service_checkpoints).where(service_checkpoints.c.path == path)).first()
            return dict(row._mapping) if row else None

    def checkpoints(self, model_id: str) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(service_checkpoints)
                .where(service_checkpoints.c.model_id == model_id)
                .order_by(service_checkpoints.c.created_at)
            )
            return [dict(r._mapping) for r in rows]
