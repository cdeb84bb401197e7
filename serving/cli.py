"""`avatar` command line: materialise a repository, serve it, run the demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from avatar.credentials import API_KEY_ENV, read_secret
from model_configs.pbtxt import RepositoryError
from serving.deployment import PROJECT_ROOT, build_repository
from serving.repository import TARGETS
from serving.server import (
    DEFAULT_KEY_HEADER,
    PROTOCOLS,
    WEB_NICENESS,
    EmbeddedServer,
    ServerOptions,
)

log = logging.getLogger("avatar")
DEFAULT_BUILD = PROJECT_ROOT / "build"
# The model whose artifact folder also holds the page's portrait rig (export/portrait)
PORTRAIT_MODEL = "portrait_renderer"


def _materialize(args: argparse.Namespace) -> int:
    try:
        models = build_repository(args.out, args.target, args.models or None)
    except RepositoryError as error:  # e.g. production without verified engines
        log.error("%s", error)
        return 1
    if args.llm_backend:
        # an LLM served by Triton's own LLM backend, off by default: its config from
        # model_repository/optional/ (the engine goes in its 1/ on the GPU host)
        source = PROJECT_ROOT / "model_repository" / "optional" / args.llm_backend
        shutil.copytree(source, args.out / args.llm_backend, dirs_exist_ok=True)
        (args.out / args.llm_backend / "1").mkdir(exist_ok=True)
        log.info(
            "%s added (its engine goes in %s/1; run the llm model with AVATAR_LLM_BACKEND=%s)",
            args.llm_backend,
            args.out / args.llm_backend,
            args.llm_backend,
        )
    for m in models:
        log.info("%-14s served as %-8s (declared %s)", m.name, m.platform, m.declared_platform)
    log.info("%s repository written to %s", args.target, args.out)
    return 0


def _session_secret() -> str:
    """$AVATAR_SESSION_SECRET, or a random one for this run when neither it nor
    $AVATAR_SESSION_SECRET_FILE is set ("" then: the file's secret reaches Triton and the
    gateway through the environment they inherit)."""
    if os.environ.get("AVATAR_SESSION_SECRET_FILE") and not os.environ.get("AVATAR_SESSION_SECRET"):
        return ""
    return os.environ.get("AVATAR_SESSION_SECRET") or secrets.token_hex(32)


def _llm_environment(args: argparse.Namespace) -> dict[str, str]:
    """The `llm` model's settings for the server's environment (avatar/llm/settings.py):
    --llm URL / --llm-model / --persona FILE (and the `avatar` model's --knowledge DIR),
    checked here so that a typo fails now, not
    as a model that does not load. The endpoint's key stays in $AVATAR_LLM_API_KEY (or
    $AVATAR_LLM_API_KEY_FILE), inherited: never argv."""
    from avatar.llm.openai_api import Endpoint
    from avatar.llm.persona import PERSONA_FILE_ENV, load_persona
    from avatar.llm.settings import MODEL_ENV, URL_ENV

    env: dict[str, str] = {}
    if args.llm:
        Endpoint(args.llm)  # ValueError: not an http(s) URL
        env[URL_ENV] = args.llm
    if args.llm_model:
        env[MODEL_ENV] = args.llm_model
    if args.persona:
        persona = load_persona(args.persona)  # PersonaError: what is wrong with the file
        log.info("persona %s from %s", persona.name, args.persona)
        env[PERSONA_FILE_ENV] = str(Path(args.persona).resolve())
    if getattr(args, "knowledge", None):  # `serve` has the flag; other callers may not
        from avatar.knowledge import KNOWLEDGE_DIR_ENV, check_knowledge_dir

        folder, passages = check_knowledge_dir(args.knowledge)  # KnowledgeError: ValueError
        log.info("knowledge: %d passages from %s", passages, folder)
        env[KNOWLEDGE_DIR_ENV] = str(folder)
    return env


def _serve(args: argparse.Namespace) -> int:
    try:
        llm_env = _llm_environment(args)
    except ValueError as error:
        log.error("%s", error)
        return 2
    repo = args.out or DEFAULT_BUILD / "repository-embedded"
    served = [m.name for m in build_repository(repo, "embedded", args.models or None)]
    options = ServerOptions(
        repo,
        host=args.host,
        session_secret=_session_secret(),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        api_key=args.api_key or read_secret(API_KEY_ENV),  # or $AVATAR_API_KEY_FILE
        key_header=args.key_header,
        restricted=tuple(args.restrict.split(",")),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        heal=args.heal,
        env=llm_env,
        # the models yield the CPU to the gateway beside them: its loop reads every
        # session's microphone and barge-in (python -m perf capacity: loop lag)
        niceness=args.models_nice if args.web else 0,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with EmbeddedServer(options) as server, contextlib.ExitStack() as stack:
        log.info(
            "serving %s: gRPC %s, HTTP %s, metrics %s (log %s); Ctrl-C stops",
            repo,
            server.grpc_url,
            server.http_url,
            server.metrics_url,
            server.log_path,
        )
        gateway = None
        if args.web:
            portrait = _portrait_rig(served)
            gateway = stack.enter_context(
                _gateway(server.grpc_url, args.web_port, options, portrait, args.gateway_argv)
            )
            page_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            scheme = "https" if args.tls_cert else "http"
            log.info(
                "live page: %s://%s:%d/ (gateway pid %d)",
                scheme,
                page_host,
                args.web_port,
                gateway.pid,
            )
        while not stop.wait(1.0):
            if not server.is_running() and not options.heal:
                log.error("tritonserver exited:\n%s", server.log_tail())
                return 1
            if gateway is not None and gateway.poll() is not None:
                log.error("the gateway exited with status %s", gateway.returncode)
                return 1
    return 0


def _portrait_rig(served: Iterable[str]) -> Path | None:
    """The rig folder for the page's WebGL portrait: the artifact folder of the served
    `portrait_renderer` model, found in the cache the way build_repository found it (the
    export registry; already built, so no work). None when that model is not served."""
    if PORTRAIT_MODEL not in served:
        log.info("%s is not served: the live page draws its cartoon face", PORTRAIT_MODEL)
        return None
    from export.registry import ensure_all
    from gateway.app import missing_rig_files

    folder = ensure_all([PORTRAIT_MODEL])[PORTRAIT_MODEL]
    missing = missing_rig_files(folder)
    if missing:
        log.warning("%s has no %s: the live page draws its cartoon face", folder, missing)
        return None
    return folder


@contextlib.contextmanager
def _gateway(
    grpc_url: str,
    port: int,
    options: ServerOptions,
    portrait: Path | None = None,
    gateway_argv: Sequence[str] = (),
):
    """The live gateway (python -m gateway) as a child process, stopped on exit;
    `portrait`: the rig folder the page draws (gateway --portrait); `gateway_argv`: the
    gateway's own settings given to `avatar serve` (gateway.__main__.forwarded)."""
    from gateway.process import running_gateway

    extra = ["--host", options.host, "--triton-key-header", options.key_header, *gateway_argv]
    if options.tls_cert:  # Triton's certificate is the root the gateway trusts; the page
        # is served over TLS with the same certificate
        extra += ["--triton-ca", str(options.tls_cert), "--tls-cert", str(options.tls_cert)]
        extra += ["--tls-key", str(options.tls_key)]
    if portrait is not None:
        extra += ["--portrait", str(portrait)]
    # secrets through the environment, never argv
    env = {"AVATAR_API_KEY": options.api_key} if options.api_key else {}
    if options.session_secret:
        env["AVATAR_SESSION_SECRET"] = options.session_secret
    with running_gateway(grpc_url, extra, port=port, env=env) as (_base, process):
        yield process


def _demo(args: argparse.Namespace) -> int:
    """A spoken question (packaged voice) -> the embedded server -> the avatar's answer as
    build/demo/answer.mp4 (+ .wav, .json), driven by the gRPC chat client; the frames are
    the server's, of the --face renderer."""
    import numpy as np

    from avatar.audio import reference_speech, write_wav
    from clients import chat

    out = Path(args.out or DEFAULT_BUILD / "demo")
    out.mkdir(parents=True, exist_ok=True)
    silence = np.zeros(8000, np.float32)
    speech = reference_speech("Hello! What is your name, and what do you do?")
    wav = write_wav(out / "question.wav", np.concatenate([silence, speech, silence]), 16000)
    with tempfile.TemporaryDirectory(prefix="avatar-demo-") as tmp:
        build_repository(Path(tmp) / "repository", "embedded")
        with EmbeddedServer(ServerOptions(Path(tmp) / "repository")) as server:
            # the server draws the frames (the portrait_renderer or the cartoon renderer)
            controls = json.dumps({"max_tokens": 64, "seed": 7, "render": True, "face": args.face})
            return chat.main(
                [str(wav), "--url", server.grpc_url, "--out", str(out), "--controls", controls]
            )


@contextlib.contextmanager
def _local_rtmp() -> Iterator[str]:
    """A local nginx-rtmp on 127.0.0.1:1935 (a free port if taken) while the broadcast runs;
    its stream URL."""
    from serving.local_services import running_rtmp_server

    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(running_rtmp_server(1935))
        except RuntimeError:  # 1935 is taken
            running = stack.enter_context(running_rtmp_server())
        url = running.url("anchor")
        log.info("local RTMP server on air at %s: watch it with `ffplay %s`", url, url)
        yield url


def _broadcast(args: argparse.Namespace) -> int:
    """On air: the show pushed to --url, against --triton or an embedded server started here
    with every model (as `avatar serve`)."""
    from broadcast.__main__ import run_until_signalled
    from broadcast.onair import BroadcastError, check_irc, output_url, settings_from_args
    from gateway.triton_client import TritonAccess

    if bool(args.url) == args.local_rtmp:
        log.error("say where to go on air: --url rtmp://... or --local-rtmp (one of the two)")
        return 2
    if args.local_rtmp:
        with _local_rtmp() as url:
            return _broadcast(argparse.Namespace(**{**vars(args), "url": url, "local_rtmp": False}))
    settings = settings_from_args(args)
    try:  # a wrong URL is said now, not after minutes of starting models
        output_url(settings.url)
        check_irc(settings)
        api_key = read_secret(API_KEY_ENV)
    except (BroadcastError, ValueError) as error:
        log.error("%s", error)
        return 2
    if args.triton:
        access = TritonAccess(api_key, args.key_header, args.triton_ca)
        return run_until_signalled(settings, args.triton, access)
    repo = args.out or DEFAULT_BUILD / "repository-embedded"
    build_repository(repo, "embedded")
    options = ServerOptions(
        repo, session_secret=_session_secret(), api_key=api_key, key_header=args.key_header
    )
    with EmbeddedServer(options) as server:
        log.info("serving %s: gRPC %s (log %s)", repo, server.grpc_url, server.log_path)
        access = TritonAccess(api_key, args.key_header)
        return run_until_signalled(settings, server.grpc_url, access)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="avatar", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    mat = sub.add_parser("materialize", help="write a runnable model repository for a target")
    mat.add_argument("--target", choices=TARGETS, default="embedded")
    mat.add_argument("--out", type=Path, required=True)
    mat.add_argument("--models", nargs="*", help="default: every model in model_repository/")
    mat.add_argument(
        "--llm-backend",
        choices=("tensorrt_llm",),
        help="also TensorRT-LLM's tensorrt_llm model for the llm model (production GPU host; "
        "docs/llm.md)",
    )
    mat.set_defaults(run=_materialize)

    serve = sub.add_parser("serve", help="run the embedded tritonserver (CPU, python backend)")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address Triton and the gateway bind (0.0.0.0: every interface)",
    )
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("--models", nargs="*", help="default: every model in model_repository/")
    serve.add_argument("--out", type=Path, help="where to materialise (default build/)")
    serve.add_argument(
        "--api-key",
        default="",
        help="require this key (header --key-header) on the --restrict protocols; "
        "default: $AVATAR_API_KEY or the file $AVATAR_API_KEY_FILE names (better: argv shows "
        "in ps), none when unset",
    )
    serve.add_argument("--key-header", default=DEFAULT_KEY_HEADER)
    serve.add_argument(
        "--restrict",
        default="inference,model-repository",
        help=f"comma-separated protocol groups that need the key, of {','.join(PROTOCOLS)}",
    )
    serve.add_argument("--tls-cert", type=Path, help="PEM server certificate: gRPC over TLS")
    serve.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    serve.add_argument(
        "--heal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reload a model whose python-backend stub died, restart the server when a "
        "BLS model's stub died or the server exited (explicit model control; "
        "serving/supervisor.py); on by default",
    )
    serve.add_argument(
        "--web",
        action="store_true",
        help="also the live gateway: the web page and WebSocket protocol on --web-port",
    )
    serve.add_argument("--web-port", type=int, default=8080)
    serve.add_argument(
        "--llm",
        metavar="URL",
        help="answer with an OpenAI-compatible chat-completions endpoint instead of the "
        "packaged SmolLM2, e.g. http://127.0.0.1:8080/v1 (key: $AVATAR_LLM_API_KEY or the "
        "file $AVATAR_LLM_API_KEY_FILE names; docs/llm.md)",
    )
    serve.add_argument("--llm-model", default="", help="the endpoint's model name")
    serve.add_argument(
        "--persona",
        type=Path,
        metavar="FILE",
        help="who the avatar is: a .toml or .json file with name, role, manner, facts "
        "(docs/llm.md)",
    )
    serve.add_argument(
        "--knowledge",
        type=Path,
        metavar="DIR",
        help="answer from the operator's documents: a folder of .md/.txt files, reloaded "
        "when they change (docs/knowledge.md)",
    )
    serve.add_argument(
        "--models-nice",
        type=int,
        default=WEB_NICENESS,
        help="with --web: the server's nice value, so that the models yield the CPU to the "
        "gateway beside them (0: equal shares)",
    )
    from gateway.flags import add_gateway_arguments, forwarded

    gateway_actions = add_gateway_arguments(
        serve.add_argument_group("the live gateway's settings (with --web; python -m gateway)")
    )
    serve.set_defaults(run=_serve)

    demo = sub.add_parser("demo", help="start the embedded server and drive it from a client")
    demo.add_argument(
        "--out", type=Path, help="where the demo writes its files (default build/demo)"
    )
    demo.add_argument(
        "--face",
        choices=("portrait", "cartoon"),
        default="portrait",
        help="the photo portrait (default) or the cartoon face in answer.mp4",
    )
    demo.set_defaults(run=_demo)

    from broadcast.onair import add_broadcast_arguments

    on_air = sub.add_parser(
        "broadcast",
        help="go on air: the avatar answers its audience's chat on an RTMP/SRT stream "
        "(docs/broadcast.md)",
    )
    add_broadcast_arguments(on_air)
    on_air.add_argument(
        "--triton",
        metavar="URL",
        help="a running Triton's gRPC address (default: start the embedded server here)",
    )
    on_air.add_argument("--triton-ca", help="PEM root certificate: gRPC to --triton over TLS")
    on_air.add_argument(
        "--key-header",
        default=DEFAULT_KEY_HEADER,
        help=f"Triton's API key header (the key: ${API_KEY_ENV} or ${API_KEY_ENV}_FILE)",
    )
    on_air.add_argument("--out", type=Path, help="where to materialise (default build/)")
    on_air.add_argument(
        "--local-rtmp",
        action="store_true",
        help="start a local nginx-rtmp (127.0.0.1:1935) and go on air there (instead of --url)",
    )
    on_air.set_defaults(run=_broadcast)

    args = parser.parse_args(argv)
    if args.command == "serve":
        args.gateway_argv = forwarded(args, gateway_actions)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
