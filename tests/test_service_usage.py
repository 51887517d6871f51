"""A training-service key's limits count what it holds now: a finished session and its
models no longer count against max_sessions_per_key / max_models_per_key (a key that once
made 32 models was locked out for good). Against the machine's PostgreSQL
(STREAMRL_TEST_EXTERNAL_DATABASE_URL, as CI sets it), in a database of its own."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from streamrl.runtime import db

URL = os.environ.get("STREAMRL_TEST_EXTERNAL_DATABASE_URL")


@pytest.fixture
def store():
    from streamrl.training_service.store import ServiceStore

    name = f"usage_{uuid.uuid4().hex[:8]}"
    with db.connect(URL, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = urlunsplit(urlsplit(db.psycopg_url(URL))._replace(path=f"/{name}"))
    db.upgrade(url)
    yield ServiceStore(url)
    with db.connect(URL, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


@pytest.mark.skipif(not URL, reason="needs an external PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL)")
def test_finished_sessions_and_their_models_leave_the_keys_usage(store):
    key_id, _ = store.create_key("tenant")
    for index in range(3):
        store.add_session(f"s{index}", key_id, "x", {})
        store.add_model(model_id=f"m{index}", session_id=f"s{index}", base_model="tiny")
    assert store.key_usage(key_id) == {"sessions": 3, "models": 3, "pending": 0}
    store.finish_session("s0")
    store.finish_session("s1")
    assert store.key_usage(key_id) == {"sessions": 1, "models": 1, "pending": 0}
