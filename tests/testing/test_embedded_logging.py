"""An embedded broker's lines go to the logging module, rendered as structlog's console renderer
renders them; other threads' lines go to structlog (broker/observability/logger.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from broker.observability.logger import (
    get_logger,
    log_to_standard_logging,
    render,
    stop_logging_to_standard_logging,
)
from broker.testing import EmbeddedBroker


@pytest.mark.parametrize("kw", [
    {},
    {"node_id": 1, "ports": [9092], "name": "a b", "flag": True, "none": None, "ratio": 1.5, "d": {"a": 1}},
    {"quoted": "it's", "eq": "a=b", "plain": "abc", "empty": ""},
])
def test_rendered_as_structlog_renders(kw: dict[str, Any]) -> None:
    renderer = structlog.dev.ConsoleRenderer(colors=False)
    assert render("broker started", dict(kw)) == renderer(None, "info", {"event": "broker started", **kw})


def test_embedded_broker_logs_through_the_logging_module(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="broker"), EmbeddedBroker() as kafka:
        kafka.create_topic("logged", partitions=2)
    lines = [r for r in caplog.records if r.name.startswith("broker")]
    started = next(r for r in lines if r.getMessage().startswith("broker started"))
    assert started.levelno == logging.INFO and "node_id=1" in started.getMessage()
    assert any(r.getMessage().startswith("topic created") and "topic=logged" in r.getMessage() for r in lines)


def _in_a_thread(work: Any) -> None:
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            done.append(None)
        except BaseException as exc:  # handed to the test's thread
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert done and done[0] is None, done


def test_a_thread_logging_to_the_logging_module(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("broker.test")

    def work() -> None:
        log_to_standard_logging(logging.WARNING)
        try:
            assert not log.is_enabled_for(logging.INFO)
            log.info("below the level")
            log.warning("kept", partition=3)
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed", api="Produce")
        finally:
            stop_logging_to_standard_logging()

    with caplog.at_level(logging.DEBUG, logger="broker.test"):
        _in_a_thread(work)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, render("kept", {"partition": 3})),
        (logging.ERROR, render("failed", {"api": "Produce"})),
    ]
    assert caplog.records[1].exc_info is not None


def test_other_threads_log_through_structlog() -> None:
    log = get_logger("broker.test")

    def work() -> None:
        log_to_standard_logging(logging.INFO)
        stop_logging_to_standard_logging()  # a thread that ended: its id may come back
        log.warning("through structlog", partition=1)

    with capture_logs() as logs:
        log.info("from the test's thread")
        _in_a_thread(work)
    assert [e["event"] for e in logs] == ["from the test's thread", "through structlog"]
