"""Running the text-generation server for one LLM artifact (same binding and auth rules as ``serve``)."""

from __future__ import annotations

import threading
from pathlib import Path


class LLMServer:
    """Serve ``path`` on one socket; :meth:`run` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(
        self,
        path: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        auth_token: str | None = None,
        insecure_bind: bool = False,
        variant: str | None = None,
        device_id: int = 0,
        trust=None,
        max_sequences: int = 8,
        kv_tokens: int | None = None,
        prefill_chunk: int = 256,
        max_queue: int = 64,
        progress=print,
    ) -> None:
        from inferx_edge.runtime.llm import LLMEngine
        from inferx_edge.serve.llm_app import LLMService, make_llm_app
        from inferx_edge.serve.server import listen

        self.sock = listen(host, port, auth_token, insecure_bind)
        try:
            engine = LLMEngine(
                path, variant=variant, device_id=device_id, trust=trust, max_sequences=max_sequences,
                kv_tokens=kv_tokens, prefill_chunk=prefill_chunk,
            )  # fmt: skip
        except BaseException:
            self.sock.close()
            raise
        name = engine.manifest.model["name"]
        self.service = LLMService(engine, name, max_queue=max_queue)
        self.app = make_llm_app(self.service, auth_token)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.started = threading.Event()
        self._uvicorn = None
        progress(
            f"  {name} ({engine.variant.name}): {max_sequences} sequences, KV cache {engine.kv_tokens} tokens "
            f"({engine.total_pages} pages of {engine.page_size}), context {engine.context_length}"
        )

    def run(self) -> bool:
        import uvicorn

        outer = self

        class _Uvicorn(uvicorn.Server):
            async def startup(self, sockets=None):
                await super().startup(sockets)
                outer.started.set()

        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
        self._uvicorn = _Uvicorn(config)
        try:
            self._uvicorn.run(sockets=[self.sock])
        finally:
            self.service.close()
            self.service.engine.close()
        return True

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True


def serve_llm(path: Path, host: str, port: int, **kwargs) -> int:
    server = LLMServer(path, host=host, port=port, **kwargs)
    print(
        f"serving on http://{host}:{server.port} (OpenAI /v1/completions, /v1/chat/completions; "
        "Triton /v2/models/NAME/generate[_stream]; /metrics)",
        flush=True,
    )
    server.run()
    print("stopped", flush=True)
    return 0
