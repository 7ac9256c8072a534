"""runrow in this Django project, on a real PostgreSQL: enqueue in atomic(), the worker
command (completes a run, drains on SIGTERM), runrow_migrate, the admin of runs."""

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction
from notes.models import Note
from psycopg.conninfo import conninfo_to_dict

import runrow
from runrow.contrib import django as runrow_django

HERE = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.django_db(transaction=True)  # real commits: a worker process reads them


class Boom(Exception):
    pass


def count(table: str, **where: str) -> int:
    sql = f'SELECT count(*) FROM "{runrow_django.schema()}".{table}'  # noqa: S608 - the tests' own names
    if where:
        sql += " WHERE " + " AND ".join(f"{k} = %s" for k in where)
    with connection.cursor() as cur:
        cur.execute(sql, list(where.values()))
        return cur.fetchone()[0]


def manage(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_enqueue_as_the_first_statement_of_atomic_rolls_back_with_it() -> None:
    # Django has sent nothing yet when the enqueue comes: it must still join atomic().
    with pytest.raises(Boom), transaction.atomic():
        run = runrow_django.enqueue(conversation_id="c-rb1", user_id="ann", content="hi")
        Note.objects.create(user_id="ann", conversation_id="c-rb1", text="hi", run_id=run.id)
        raise Boom
    with pytest.raises(runrow.RunNotFound):
        runrow_django.get_run(run.id)
    assert count("message", conversation_id="c-rb1") == 0
    assert count("agent_run", conversation_id="c-rb1") == 0
    assert not Note.objects.filter(conversation_id="c-rb1").exists()


def test_the_view_rolls_back_its_row_and_the_turn_together(client) -> None:
    response = client.post(
        "/conversations/c-rb2/messages",
        data=json.dumps({"text": "never mind", "reject": True}),
        content_type="application/json",
        headers={"X-User": "ann"},
    )
    assert response.status_code == 409
    assert not Note.objects.filter(conversation_id="c-rb2").exists()
    assert count("message", conversation_id="c-rb2") == 0
    assert count("agent_run", conversation_id="c-rb2") == 0


def test_a_runrow_error_in_atomic_leaves_djangos_transaction_usable() -> None:
    with transaction.atomic():
        Note.objects.create(user_id="ann", conversation_id="c-err", text="kept")
        with pytest.raises(runrow.SchemaOutOfDate):  # a statement failed in Django's transaction
            runrow_django.enqueue(conversation_id="c-err", user_id="ann", content="x", schema="no_such")
        Note.objects.create(user_id="ann", conversation_id="c-err", text="also kept")
    assert Note.objects.filter(conversation_id="c-err").count() == 2


def test_a_committed_post_is_one_run_that_the_worker_command_completes(client) -> None:
    response = client.post(
        "/conversations/c-ok/messages",
        data=json.dumps({"text": "hello"}),
        content_type="application/json",
        headers={"X-User": "ann"},
    )
    assert response.status_code == 202, response.content
    run_id = uuid.UUID(response.json()["run_id"])
    assert count("agent_run", conversation_id="c-ok") == 1
    assert Note.objects.get(conversation_id="c-ok").run_id == run_id
    info = runrow_django.get_run(run_id)
    assert info.status == "queued" and info.conversation_id == "c-ok"

    # (Django's commands own --version: the worker's is --worker-version.)
    worker = manage(
        "runrow_worker", "notes.agents:agent", "--concurrency", "2", "--json", "--worker-version", "notes-1"
    )
    try:
        wait_for(lambda: runrow_django.get_run(run_id).status == "completed", "the run to complete")
        assert runrow_django.get_run(run_id).version == "notes-1"
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert count("agent_run", conversation_id="c-ok") == 1
    assert count("message", conversation_id="c-ok", role="assistant") == 1


def test_the_worker_command_drains_a_run_in_flight_on_sigterm(tmp_path) -> None:
    gate = tmp_path / "go"
    with transaction.atomic():
        run = runrow_django.enqueue(conversation_id="c-drain", user_id="ann", content=f"wait-for {gate}")
    worker = manage("runrow_worker", "notes.agents:agent", "--json", "--drain-seconds", "60")
    try:
        wait_for(lambda: runrow_django.get_run(run.id).status == "running", "a worker to claim the run")
        worker.send_signal(signal.SIGTERM)
        lines = []
        while not any(line.get("event") == "draining" for line in lines):
            line = worker.stdout.readline()
            assert line, f"the worker ended without draining: {worker.stderr.read()}"
            lines.append(json.loads(line))
        assert runrow_django.get_run(run.id).status == "running"  # still in flight while draining
        gate.touch()
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    stopped = [json.loads(line) for line in out.splitlines() if line.strip()][-1]
    assert stopped["event"] == "stopped"
    assert stopped["finished"] == [str(run.id)] and stopped["interrupted"] == []
    assert runrow_django.get_run(run.id).status == "completed"


def test_runrow_migrate_migrates_a_fresh_schema() -> None:
    fresh = f"fresh_{uuid.uuid4().hex[:8]}"
    done = manage("runrow_migrate", "--schema", fresh, "--json")
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    report = json.loads(out)
    assert report["schema"] == fresh
    # Every version, in order (a number another branch took may be missing until it lands).
    applied = report["applied"]
    assert applied[0] == 1 and applied[-1] == runrow.latest_version() and applied == sorted(set(applied))
    with runrow_django.psycopg_connection() as conn, pytest.raises(runrow.RunNotFound):
        runrow.sync.get_run(conn, uuid.uuid4(), schema=fresh)
    again = manage("runrow_migrate", "--schema", fresh, "--json")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and json.loads(out)["applied"] == [], err


def test_the_admin_lists_runs_and_shows_a_journal_read_only(admin_client) -> None:
    with transaction.atomic():
        run = runrow_django.enqueue(
            conversation_id="c-admin", user_id="bob", content="hello", request={"model": "m1"}
        )
    assert runrow_django.get_run(run.id).request == {"model": "m1"}  # jsonb reads as JSON
    listing = admin_client.get("/admin/runrow/run/")
    assert listing.status_code == 200
    assert str(run.id) in listing.content.decode()
    page = admin_client.get(f"/admin/runrow/run/{run.id}/change/")
    assert page.status_code == 200
    assert "run_queued" in page.content.decode()  # the journal's first event
    assert admin_client.get("/admin/runrow/run/add/").status_code == 403
    assert admin_client.post(f"/admin/runrow/run/{run.id}/delete/").status_code == 403


def test_the_admin_has_its_css(admin_client) -> None:
    """The admin's pages link their stylesheets, and each answers: without
    django.contrib.staticfiles (and a route to it) /admin/ is unstyled HTML."""
    page = admin_client.get("/admin/runrow/run/").content.decode()
    sheets = re.findall(r'<link rel="stylesheet"[^>]*href="([^"]+)"', page)
    assert "/static/admin/css/base.css" in sheets, sheets
    for url in sheets:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert response["Content-Type"].startswith("text/css"), (url, response["Content-Type"])
        assert b"".join(response.streaming_content if response.streaming else [response.content])


def test_the_worker_conninfo_keeps_libpq_options_and_drops_djangos(settings) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "other": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "app db",
            "USER": "ann",
            "PASSWORD": "s3cret",
            "HOST": "db.internal",
            "PORT": 6432,
            "OPTIONS": {"sslmode": "require", "isolation_level": 2, "server_side_binding": True},
        },
    }
    got = conninfo_to_dict(runrow_django.conninfo("other"))
    assert got == {
        "dbname": "app db",
        "user": "ann",
        "password": "s3cret",
        "host": "db.internal",
        "port": "6432",
        "sslmode": "require",
    }
