"""The operator's documents on a real tritonserver: the `avatar` model reads the folder of
$AVATAR_KNOWLEDGE_DIR, embeds it with the served `emotion_encoder`, places the best passage
in the `llm` request of each turn (reported in the turn's timings) and reloads the folder
when a document changes, while it serves."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

POOL = "# Pool\n\nThe rooftop pool opens at 7 am and closes at 10 pm. Towels are at the bar.\n"
SPA = "# Spa\n\nThe Lotus Spa is on the second floor. A massage costs 80 euros.\n"
MODELS = ["avatar", "llm", "llm_decoder", "tts", "tts_vits", "emotion_encoder"]


@pytest.fixture(scope="module")
def knowledge_server(embedded_repository: Path, tmp_path_factory):
    from serving.server import EmbeddedServer, ServerOptions

    folder = tmp_path_factory.mktemp("knowledge")
    (folder / "pool.md").write_text(POOL)
    options = ServerOptions(
        embedded_repository,
        models=MODELS,
        startup_timeout_s=600,
        env={"AVATAR_KNOWLEDGE_DIR": str(folder)},
    )
    with EmbeddedServer(options) as server:
        yield server, folder


def ask(server, text: str) -> dict:
    from clients.avatar_stream import stream_turn

    turn = stream_turn(server.grpc_url, text=text, controls={"max_tokens": 24, "seed": 1})
    assert turn.final, turn.error
    assert turn.sentences, turn.errors
    return turn.timings


def test_a_question_gets_its_passage_and_small_talk_none(knowledge_server):
    server, _ = knowledge_server
    timings = ask(server, "When does the pool open?")
    assert timings["knowledge"]["passages"] == 1, timings
    assert timings["knowledge"]["best_score"] > 0.5
    assert 0 < timings["knowledge"]["tokens"] <= 160  # the budget of the prompt's passages
    assert timings["stage_ms"]["knowledge"] > 0  # the retrieval step, in the turn's timings
    small_talk = ask(server, "Hello!")
    assert small_talk.get("knowledge", {"passages": 0})["passages"] == 0, small_talk


@pytest.mark.extended  # CI: served passages above, the reload in test_knowledge.py
def test_a_new_document_is_read_while_serving(knowledge_server):
    server, folder = knowledge_server
    before = ask(server, "How much is a massage at the spa?")["knowledge"]["best_score"]
    (folder / "spa.md").write_text(SPA)
    time.sleep(2.5)  # the folder is compared every 2 s (knowledge_check_s), at turn time
    after = ask(server, "How much is a massage at the spa?")["knowledge"]
    assert after["best_score"] > before + 0.2, (before, after)
