"""The Jupyter kernels ragbench starts (``make demo``, sweeps, ``make lab``): encrypted, free of
credentials on disk, and gone when the process that started them goes.

- Encryption: the kernel manager provisions CurveZMQ keys when the kernelspec declares support,
  so kernel traffic is encrypted: the fix ipykernel 7.x names in the "Kernel is running over TCP
  without encryption" warning it logs at every start otherwise.
- No IPython history: an IPython kernel saves every cell it runs (the injected parameters, a URL
  with a password, a ``?token=``) to ``$IPYTHONDIR/profile_default/history.sqlite``, unless its
  kernel is named ``python3`` and nbclient starts it. Every IPython kernel ragbench starts gets
  ``--HistoryManager.enabled=False`` (:data:`HISTORY_OFF`): papermill's (:func:`execute_notebook`)
  and JupyterLab's (:func:`kernel_cli_args` names :class:`HistoryOffKernelManager`;
  :func:`lab_cli_args` adds ``--allow-root`` where ``make lab`` runs as root).
- No credentials in executed notebooks: papermill writes the parameters it injects (an API key,
  a URL with a password) into the notebook's first cells and metadata, and a careless cell may
  print them. :func:`execute_notebook` routes every save papermill makes (after each cell, on a
  failure, at the end) through :func:`redact_notebook`, so no version with a credential in it
  ever reaches the disk, not even while a long notebook runs or after the process is killed.
- Lifetime: pool workers and the kernels they start end with the sweep that started them
  (:func:`reap_children_on_signals` in the sweep process, :func:`init_worker` in each worker).

jupyter_client, jupyter_server, pyzmq, papermill and psutil are imported inside the functions.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ragbench import secrets
from ragbench.io import atomic_write_text
from ragbench.locks import drop_owner_files
from ragbench.workspace.scrub import by_html_part, outside_data_uris, redact_keeping_links

if TYPE_CHECKING:
    import psutil
    from traitlets.config import Config


def kernel_config() -> Config:
    """traitlets config for the kernels papermill starts, with transport encryption. Empty with a
    jupyter_client or pyzmq too old to do it."""
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_trait_names() or not zmq.has("curve"):
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def kernel_cli_args() -> list[str]:
    """:func:`kernel_config` as command-line flags for ``jupyter lab`` / ``jupyter server`` (the
    Makefile's ``lab`` target), so JupyterLab's kernels are encrypted too, and the server's
    kernel manager class, :class:`HistoryOffKernelManager`, so they keep no history on disk."""
    manager = f"{__name__}.{_SERVER_MANAGER}"
    return [
        f"--{section}.{name}={value}"
        for section, traits in kernel_config().items()
        for name, value in traits.items()
    ] + [f"--AsyncMappingKernelManager.kernel_manager_class={manager}"]


def lab_cli_args(uid: int | None = None) -> list[str]:
    """What ``make lab`` passes ``jupyter lab``: :func:`kernel_cli_args`, plus ``--allow-root``
    when it runs as root (``uid`` 0; None: this process's effective uid). Jupyter refuses to
    start as root without it, and root is who runs it in CI and most containers; elsewhere the
    flag is left out, so the refusal still guards a desktop root shell started by mistake."""
    uid = os.geteuid() if uid is None else uid
    return [*kernel_cli_args(), *(["--allow-root"] if uid == 0 else [])]


# IPython's SQLite history off: no cell source (credentials included) is saved to disk
HISTORY_OFF = ("--HistoryManager.enabled=False",)


def is_ipython_kernel(argv: list[str]) -> bool:
    """A kernelspec's argv starts ipykernel (``-m ipykernel_launcher``): the flags in
    :data:`HISTORY_OFF` are IPython's, and another kernel could reject them."""
    return any(Path(arg).name.split(".")[0] in ("ipykernel", "ipykernel_launcher") for arg in argv)


def history_off_arguments(kernel_name: str, given: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``given`` kernel arguments plus :data:`HISTORY_OFF` when ``kernel_name`` is an IPython
    kernel (those not given already)."""
    from jupyter_client.kernelspec import KernelSpecManager

    argv = KernelSpecManager().get_kernel_spec(kernel_name).argv
    extra = [a for a in HISTORY_OFF if a not in given] if is_ipython_kernel(argv) else []
    return [*given, *extra]


_SERVER_MANAGER = "HistoryOffKernelManager"
_built: dict[str, type] = {}


def __getattr__(name: str) -> object:
    """``HistoryOffKernelManager``: jupyter_server's ``ServerKernelManager`` whose IPython kernels
    start with :data:`HISTORY_OFF`. Built when first looked up (PEP 562: the server imports it by
    name), so importing this module imports no jupyter_server."""
    if name != _SERVER_MANAGER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

        class HistoryOffKernelManager(ServerKernelManager):
            def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
                extra = list(extra_arguments or [])
                if self.kernel_spec is not None and is_ipython_kernel(self.kernel_spec.argv):
                    extra += [a for a in HISTORY_OFF if a not in extra]
                return super().format_kernel_cmd(extra)

        HistoryOffKernelManager.__module__, HistoryOffKernelManager.__qualname__ = __name__, name
        _built[name] = HistoryOffKernelManager
    return _built[name]


PROJECT_KERNEL = "ragbench"  # the kernelspec the notebooks name; `make setup` installs it
_INSTALL_HINT = (
    "`make setup` installs it, or run `python -m ipykernel install --sys-prefix --name "
    "ragbench` with the environment's python"
)


class KernelNotInstalledError(ValueError):
    """A notebook or sweep asks for a Jupyter kernel that is not installed."""


def resolve_kernel(notebook: str | os.PathLike, kernel_name: str | None = None) -> str:
    """The kernel a notebook executes with: ``kernel_name`` if given, else the notebook's
    kernelspec (the project's ``ragbench`` kernel for every shipped notebook). Raises
    :class:`KernelNotInstalledError` naming the installed kernels and how to install it, before
    anything starts (papermill's own error is a bare ``NoSuchKernel``)."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager

    if not kernel_name:
        nb = nbformat.read(str(notebook), as_version=4)
        kernel_name = nb.metadata.get("kernelspec", {}).get("name") or PROJECT_KERNEL
    installed = KernelSpecManager().find_kernel_specs()
    if kernel_name not in installed:
        hint = _INSTALL_HINT if kernel_name == PROJECT_KERNEL else "install it or pick another"
        raise KernelNotInstalledError(
            f"{Path(notebook).name}: Jupyter kernel {kernel_name!r} is not installed ({hint}); "
            f"installed: {', '.join(sorted(installed)) or 'none'}"
        )
    return kernel_name


def execute_notebook(notebook: str | os.PathLike, output: str | os.PathLike, **kwargs: Any) -> Any:
    """``papermill.execute_notebook`` with :func:`kernel_config`; keyword arguments as papermill's
    (parameters, cwd, kernel_name, progress_bar, ...). Returns the executed notebook, redacted.
    The kernel is :func:`resolve_kernel`'s: the notebook's own (``ragbench``) unless named, and
    an IPython kernel starts with its history off (:func:`history_off_arguments`).

    Every save of ``output`` is redacted (:func:`redact_notebook`), and the credentials among
    ``parameters`` are remembered (``secrets.collect``) so that a cell printing one bare (``key
    in use: abc123``) is masked too."""
    import nbformat
    import papermill

    secrets.collect(kwargs.get("parameters") or {})
    kwargs["kernel_name"] = resolve_kernel(notebook, kwargs.get("kernel_name"))
    kwargs["extra_arguments"] = history_off_arguments(
        kwargs["kernel_name"], list(kwargs.get("extra_arguments") or [])
    )
    _register_redacting_io()
    # absolute: papermill saves while it has chdir'ed into ``cwd``
    target = _REDACTED_SCHEME + str(Path(output).resolve())
    nb = papermill.execute_notebook(str(notebook), target, config=kernel_config(), **kwargs)
    return nbformat.from_dict(redact_notebook(nb))


# --- executed notebooks without credentials -------------------------------------------------------

# Output mime types holding text a credential could be spelled in. The others (image/png,
# image/jpeg, application/pdf) are base64 and stay byte for byte.
_TEXT_MIME = re.compile(r"text/.*|image/svg\+xml|application/javascript")


def redact_notebook(nb: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a notebook (nbformat 4, as a dict) with every cell source and output passed
    through ``secrets.redact_text`` (text, Markdown, HTML, an error's name, value and
    traceback), JSON outputs and papermill's recorded parameters through ``secrets.redact``.
    The credentials the code cells spell out (``secrets.code_secrets``: ``api_key = "sk-..."``)
    are masked in every output too, as the code rule masks them in the code: a cell that
    prints or raises with a short key shows it in no form the patterns know. Images,
    attachments and data: URIs are left untouched (a base64 alphabet must not be edited)."""
    out: dict[str, Any] = json.loads(json.dumps(nb, default=str))  # a plain deep copy
    papermill = out.get("metadata", {}).get("papermill")
    if isinstance(papermill, dict) and isinstance(papermill.get("parameters"), dict):
        papermill["parameters"] = secrets.redact(papermill["parameters"])
    cells = out.get("cells", [])
    known: set[str] = set()
    for cell in cells:
        if cell.get("cell_type") == "code":
            known |= secrets.code_secrets(_joined(cell.get("source", "")))
    state = secrets.state()  # once: it reads the whole environment
    for cell in cells:
        if "source" in cell:  # code: a quoted credential is masked whatever it looks like
            code = cell.get("cell_type") == "code"
            cell["source"] = _redact_text_field(cell["source"], code=code, known=known, state=state)
        for output in cell.get("outputs", []):
            _redact_output(output, known, state)
    return out


def _redact_output(
    output: dict[str, Any],
    known: set[str],
    state: tuple[frozenset[str], frozenset[str]] | None = None,
) -> None:
    """One output redacted in place: stream text, an error's ename, evalue and traceback (line
    by line: IPython colours them with ANSI codes), display data by MIME type."""
    if "text" in output:
        output["text"] = _redact_text_field(output["text"], known=known, state=state)
    for key in ("ename", "evalue"):
        if isinstance(output.get(key), str):
            output[key] = secrets.redact_text(output[key], known=known)
    if isinstance(output.get("traceback"), list):
        output["traceback"] = [
            _redact_text_field(line, known=known, state=state) for line in output["traceback"]
        ]
    data = output.get("data")
    if not isinstance(data, dict):
        return
    for mime, value in data.items():
        if "json" in mime:  # application/json, application/vnd.*+json
            data[mime] = _masked(secrets.redact(value), known)
        elif _TEXT_MIME.fullmatch(mime):
            data[mime] = _redact_text_field(
                value, html=mime == "text/html", known=known, state=state
            )


def _masked(value: object, known: set[str]) -> object:
    """The strings of a JSON value with ``known`` values masked (``secrets.redact`` did the rest)."""
    if not known:
        return value
    if isinstance(value, str):
        return secrets.redact_text(value, known=known)
    if isinstance(value, dict):
        return {k: _masked(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, known) for v in value]
    return value


def _joined(value: object) -> str:
    """A notebook text field (a string or a list of lines) as one text."""
    return "".join(str(v) for v in value) if isinstance(value, list) else str(value or "")


# text field -> its redaction, keyed by everything the redaction reads (flags, the notebook's own
# values, ``secrets.state()``): papermill saves the whole notebook before and after each cell and
# every save is redacted, so without it an executed notebook's earlier outputs were redacted again
# at each of its cells (a notebook of 30 cells spent about half its run time in redaction)
_REDACTED: dict[tuple[Any, ...], str] = {}
_REDACTED_MAX_CHARS = 1 << 24  # texts held at most (then forgotten at once)
_redacted_lock = threading.Lock()
_redacted_chars = 0


def _redact_text_field(
    value: object,
    html: bool = False,
    code: bool = False,
    known: set[str] | None = None,
    state: tuple[frozenset[str], frozenset[str]] | None = None,
) -> object:
    """A notebook text field, a string or a list of lines: redacted as one text (a credential or
    a data: URI may span the split), then split back into lines. Links without credentials keep
    their spelling (``scrub.redact_keeping_links``). ``html``: the field is HTML, each <script>
    in it JavaScript (``scrub.by_html_part``: masked, never HTML-escaped). ``code``: a code
    cell's source, where a quoted literal of a credential name is masked whatever it looks like
    (``secrets.mask_code_literals``). ``known``: more values to mask (the notebook's own).
    ``state``: ``secrets.state()`` if the caller has it (the memo's key)."""
    found = tuple(sorted(known or ()))
    state = secrets.state() if state is None else state

    def redact(text: str, escaped: bool) -> str:
        text = secrets.mask_code_literals(text) if code else text
        return redact_keeping_links(text, escaped=escaped, known=found)

    def edit(text: str) -> str:
        key = (text, html, code, found, state)
        done = _REDACTED.get(key)
        if done is not None:
            return done
        if html:
            out = by_html_part(
                text, lambda part, esc: outside_data_uris(part, lambda p: redact(p, esc))
            )
        else:
            out = outside_data_uris(text, lambda p: redact(p, False))
        global _redacted_chars
        with _redacted_lock:
            if _redacted_chars + len(text) > _REDACTED_MAX_CHARS:
                _REDACTED.clear()
                _redacted_chars = 0
            _REDACTED[key] = out
            _redacted_chars += len(text)
        return out

    if isinstance(value, list):
        return edit(_joined(value)).splitlines(keepends=True)
    if isinstance(value, str):
        return edit(value)
    return value


def _write_notebook(path: Path, nb: dict[str, object]) -> Path:
    # nbformat's own layout (indent 1, sorted keys), so diffs against papermill's files stay small
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    return atomic_write_text(path, text)


_REDACTED_SCHEME = "ragbench-redacted://"
_registered = threading.Lock()
_is_registered = False


class _RedactingHandler:
    """papermill I/O handler for ``ragbench-redacted://<absolute path>``: each save is redacted,
    then written atomically (a reader never sees half a notebook). Only writes are routed here."""

    @staticmethod
    def _path(path: str) -> str:
        return path[len(_REDACTED_SCHEME) :]

    def write(self, buf: str, path: str) -> None:
        target = Path(self._path(path))
        nb = redact_notebook(json.loads(buf))
        papermill = nb.get("metadata", {}).get("papermill")
        if isinstance(papermill, dict):
            papermill["output_path"] = str(target)  # not our routing prefix
        _write_notebook(target, nb)

    def read(self, path: str) -> str:
        return Path(self._path(path)).read_text(encoding="utf-8")

    def listdir(self, path: str) -> list[str]:
        folder = self._path(path)
        return [os.path.join(folder, name) for name in os.listdir(folder)]

    def pretty_path(self, path: str) -> str:
        return self._path(path)


def _register_redacting_io() -> None:
    global _is_registered
    with _registered:
        if not _is_registered:
            from papermill.iorw import papermill_io

            papermill_io.register(_REDACTED_SCHEME, _RedactingHandler())
            _is_registered = True


# --- processes end with the sweep that started them -----------------------------------------------

GRACE_SECONDS = 3.0  # SIGTERM first (a kernel shuts down cleanly), SIGKILL what is left after this


def kill_tree(processes: list[psutil.Process], grace: float = GRACE_SECONDS) -> None:
    """Terminate ``processes`` (psutil.Process) and all their descendants; kill what is still
    alive after ``grace`` seconds. Descendants are listed first: a child whose parent dies is
    re-parented and could no longer be found."""
    import psutil

    everything: dict[int, psutil.Process] = {}
    for proc in processes:
        try:
            for p in [proc, *proc.children(recursive=True)]:
                everything[p.pid] = p
        except psutil.Error:
            continue
    for proc in everything.values():
        with suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(list(everything.values()), timeout=grace)
    for proc in alive:
        with suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)


@contextmanager
def reap_children_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT first end every process this one started inside
    it (pool workers, the kernels they or this process run, and their children), then call the
    handler that was there before and raise: ``KeyboardInterrupt`` for SIGINT (as Python does),
    ``SystemExit(143)`` for SIGTERM (the shell's code for it), so ``finally`` blocks and locks
    still unwind.

    Processes that were already children before the block are left alone (a notebook running a
    sweep keeps its other subprocesses). Signal handlers can only be set in the main thread;
    elsewhere the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import psutil

    me = psutil.Process()
    before = {(p.pid, _created(p)) for p in me.children()}

    def handler(signum: int, frame: FrameType | None) -> None:
        kill_tree(
            [p for p in me.children() if (p.pid, _created(p)) not in before and not _is_tracker(p)]
        )
        previous = saved[signum]
        if callable(previous):
            previous(signum, frame)  # for SIGINT Python's own: raises KeyboardInterrupt
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    # an ignored signal stays ignored (``nohup``, a background job of a script: no Ctrl-C)
    # signal -> its handler before
    saved: dict[int, Callable[[int, FrameType | None], object] | int | signal.Handlers | None] = {
        s: signal.getsignal(s)
        for s in (signal.SIGTERM, signal.SIGINT)
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    for s in saved:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


def _is_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker: it ignores SIGTERM by design, exits by itself when
    this process does and then frees what the pool left; killing it leaks and spews tracebacks."""
    try:
        return "multiprocessing.resource_tracker" in " ".join(proc.cmdline())
    except Exception:
        return False


def _created(proc: psutil.Process) -> float:
    try:
        return proc.create_time()
    except Exception:  # gone already: it cannot be confused with a new one
        return 0.0


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def init_worker(parent_pid: int) -> None:
    """Initializer of a sweep's pool workers: they end with the sweep.

    - SIGTERM (from the sweep's handler, or from the kernel when the sweep dies, even by
      SIGKILL: Linux's ``PR_SET_PDEATHSIG``) ends the worker's kernels, then the worker, without
      writing a marker: an interrupted point is not a failed one and runs again on resume.
    - SIGINT is ignored here: Ctrl-C reaches the whole foreground process group, and the sweep
      process decides (it stops the workers with SIGTERM). A no-op handler rather than SIG_IGN,
      which the kernels would inherit through exec and then could not be interrupted.
    """
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, _worker_terminated)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the sweep died before prctl took effect
        _worker_terminated(signal.SIGTERM, None)


def _worker_terminated(signum: int, frame: object) -> None:
    import psutil

    drop_owner_files()  # first: the sweep kills this worker 3 s after its SIGTERM
    try:
        kill_tree(psutil.Process().children())
    finally:
        os._exit(128 + signum)  # no cleanup that could block: the point's lock is an flock
