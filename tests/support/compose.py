"""A compose file's services as processes on 127.0.0.1, for a machine where no container engine runs.

``ComposeFile`` reads the file as Compose does: YAML anchors and merges, ``${NAME}``,
``${NAME:-default}`` and ``${NAME:?message}`` from the variables given (the operator's shell),
and for a service built from a Dockerfile, the image's ``ENV``, ``CMD``, ``EXPOSE`` and
``HEALTHCHECK`` (``Dockerfile``). ``LocalCompose`` starts each service with that command and
environment, changing only what a container's network and file system would have supplied:
other services' names become 127.0.0.1 and a free port each (``http://s3:5000`` ->
``http://127.0.0.1:PORT``), a server binds 127.0.0.1 instead of 0.0.0.0, the paths of bind mounts
and of the image become the host's, and ``python`` and ``ragwarden`` are this environment's. It
starts them in ``depends_on`` order under each condition (started, healthy by the service's own
health check, completed successfully), waits for every health check (``up --wait``), and stops
them all on exit. Anything this reading does not cover (an entrypoint, a shell-form command) is
refused, so a test never runs something other than what the file says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from support.replicas import free_port

EXECUTABLES = {"python": sys.executable, "ragwarden": str(Path(sys.executable).with_name("ragwarden"))}
PORT_OPTIONS = ("-p", "--port")
# $$, ${NAME}, ${NAME-default}, ${NAME:-default}, ${NAME?message}, ${NAME:?message}, $NAME
_VARIABLE = re.compile(
    r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class ComposeError(Exception):
    """The compose file or Dockerfile says something this reading cannot run as written."""


# -- reading ------------------------------------------------------------------------------------


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """``value`` with Compose's ``$`` substitutions made from ``variables``, through lists and mappings."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        given = variables.get(name)
        missing = given is None or (given == "" and op is not None and op.startswith(":"))
        if op in ("-", ":-") and missing:
            return arg
        if op in ("?", ":?") and missing:
            raise ComposeError(f"{name}: {arg}")
        return given or ""

    return _VARIABLE.sub(substitute, value)


@dataclass(frozen=True, kw_only=True)
class Dockerfile:
    """The instructions of a Dockerfile, in order, with what an image built from it runs."""

    instructions: tuple[tuple[str, str], ...]

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        lines, joined = [], ""
        for raw in path.read_text(encoding="utf-8").splitlines():
            if not joined and (not raw.strip() or raw.lstrip().startswith("#")):
                continue
            if raw.endswith("\\"):
                joined += raw[:-1]
                continue
            lines.append(joined + raw)
            joined = ""
        if joined:
            raise ComposeError(f"{path.name} ends inside a continued line")
        instructions = []
        for line in lines:
            keyword, _, arguments = line.strip().partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
        return cls(instructions=tuple(instructions))

    def all(self, keyword: str) -> list[str]:
        return [arguments for name, arguments in self.instructions if name == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for arguments in self.all("ENV"):
            words = shlex.split(arguments)
            if words and "=" not in words[0]:  # the old form: ENV NAME value with spaces
                values[words[0]] = arguments.split(None, 1)[1]
                continue
            values.update(word.split("=", 1) for word in words)  # type: ignore[arg-type]
        return values

    @property
    def cmd(self) -> list[str] | None:
        given = self.last("CMD")
        return None if given is None else _exec_form(given, "CMD")

    @property
    def exposed(self) -> list[int]:
        return [int(port.split("/")[0]) for arguments in self.all("EXPOSE") for port in arguments.split()]

    @property
    def healthcheck(self) -> list[str] | None:
        given = self.last("HEALTHCHECK")
        if given is None or given.upper() == "NONE":
            return None
        form = re.fullmatch(r"(?:--\S+\s+)*CMD\s+(.+)", given, re.DOTALL | re.IGNORECASE)
        if form is None:
            raise ComposeError(f"HEALTHCHECK {given!r}: only the CMD form is read")
        return ["CMD", *_exec_form(form.group(1), "HEALTHCHECK CMD")]


def _exec_form(arguments: str, what: str) -> list[str]:
    try:
        words = json.loads(arguments)
    except json.JSONDecodeError:
        words = None
    if not (isinstance(words, list) and words and all(isinstance(word, str) for word in words)):
        raise ComposeError(f"{what} {arguments!r}: only the exec form (a JSON list) is read")
    return words


@dataclass(frozen=True, kw_only=True)
class Service:
    """One service as a container of it would run: its command (None: its image's, from no
    Dockerfile here), environment and health check, the port it listens on, its bind mounts
    (container path -> host path), and the services it waits for under which condition."""

    name: str
    command: tuple[str, ...] | None
    environment: Mapping[str, str]
    healthcheck: tuple[str, ...] | None
    port: int | None
    mounts: Mapping[str, Path]
    depends_on: Mapping[str, str]
    image: Dockerfile | None


@dataclass(frozen=True, kw_only=True)
class ComposeFile:
    path: Path
    services: Mapping[str, Service]

    @classmethod
    def read(cls, path: Path, variables: Mapping[str, str]) -> ComposeFile:
        document = interpolate(yaml.safe_load(path.read_text(encoding="utf-8")), variables)
        services = {name: _service(path.parent, name, spec) for name, spec in document["services"].items()}
        return cls(path=path, services=services)

    @property
    def completing(self) -> frozenset[str]:
        """The services another waits for to exit 0 (``service_completed_successfully``): jobs."""
        return frozenset(other for service in self.services.values() for other, condition in service.depends_on.items()
                         if condition == "service_completed_successfully")  # fmt: skip


def _service(folder: Path, name: str, spec: Mapping[str, Any]) -> Service:
    if "entrypoint" in spec:
        raise ComposeError(f"service {name}: an entrypoint is not read here; give the command alone")
    image = None
    if "build" in spec:
        build = spec["build"] if isinstance(spec["build"], dict) else {"context": spec["build"]}
        image = Dockerfile.read(folder / build.get("context", ".") / build.get("dockerfile", "Dockerfile"))
    command = spec.get("command", image.cmd if image is not None else None)
    if isinstance(command, str) or command == []:
        raise ComposeError(f"service {name}: give its command as a list (exec form), got {command!r}")
    check = spec.get("healthcheck", {})
    test = None if check.get("disable") else check.get("test", image.healthcheck if image is not None else None)
    if test is not None and (isinstance(test, str) or test[0] != "CMD"):
        raise ComposeError(f"service {name}: only a health check of the CMD form is read, got {test!r}")
    ports = [int(port) for port in spec.get("expose", [])] or (image.exposed if image is not None else [])
    if len(ports) > 1:
        raise ComposeError(f"service {name}: one port per service is mapped, got {ports}")
    environment = spec.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    depends = spec.get("depends_on", {})
    if isinstance(depends, list):
        depends = {other: {"condition": "service_started"} for other in depends}
    return Service(
        name=name,
        command=None if command is None else tuple(str(word) for word in command),
        environment={**(image.env if image is not None else {}), **{k: str(v) for k, v in environment.items()}},
        healthcheck=tuple(test[1:]) if test is not None else None,
        port=ports[0] if ports else None,
        mounts=dict(_bind_mount(folder, name, volume) for volume in spec.get("volumes", []) if _is_bind(volume)),
        depends_on={other: condition["condition"] for other, condition in depends.items()},
        image=image,
    )


def _is_bind(volume: str | Mapping[str, Any]) -> bool:
    source = volume.get("source", "") if isinstance(volume, dict) else volume.split(":", 1)[0]
    return source.startswith((".", "/"))


def _bind_mount(folder: Path, name: str, volume: str | Mapping[str, Any]) -> tuple[str, Path]:
    if isinstance(volume, dict):
        source, target = volume["source"], volume["target"]
    else:
        source, target, *_ = volume.split(":")
    host = (folder / source).resolve()
    if not host.exists():
        raise ComposeError(f"service {name} mounts {source}, which is not there")
    return target, host


# -- running ------------------------------------------------------------------------------------


@dataclass
class LocalCompose:
    """``compose``'s services but ``skip`` running on 127.0.0.1; ``paths`` maps paths inside an
    image (``/opt/...``) to the host's. Logs go to ``folder``; use as a context manager."""

    compose: ComposeFile
    folder: Path
    paths: Mapping[str, Path] = field(default_factory=dict)
    skip: Iterable[str] = ()
    timeout: float = 180.0
    ports: dict[str, int] = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.skip = frozenset(self.skip)
        self.ports = {name: free_port() for name, service in self.compose.services.items() if service.port is not None}

    def __enter__(self) -> Self:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.down()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def log(self, name: str) -> str:
        """What the service has written to its stdout and stderr so far."""
        return (self.folder / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def _tail(self, name: str) -> str:
        return self.log(name)[-4000:]

    # -- the local equivalents of what a container is given ----------------------------------------

    def _local(self, service: Service, text: str) -> str:
        """``text`` (an argument or a value) as it must read outside a container."""
        for other, port in self.ports.items():
            text = re.sub(rf"//{re.escape(other)}:{self.compose.services[other].port}\b", f"//127.0.0.1:{port}", text)
        if service.port is not None:
            text = re.sub(rf"\b(127\.0\.0\.1|localhost):{service.port}\b", rf"\g<1>:{self.ports[service.name]}", text)
        text = text.replace("0.0.0.0", "127.0.0.1")
        for inside, host in sorted({**service.mounts, **self.paths}.items(), key=lambda item: -len(item[0])):
            if text == inside or text.startswith(inside.rstrip("/") + "/"):
                return str(host) + text[len(inside.rstrip("/")):]
        return text

    def _argv(self, service: Service, words: Iterable[str]) -> list[str]:
        argv = [self._local(service, word) for word in words]
        if argv[0] not in EXECUTABLES:
            raise ComposeError(f"service {service.name} runs {argv[0]!r}; known here: {sorted(EXECUTABLES)}")
        argv[0] = EXECUTABLES[argv[0]]
        for n in range(1, len(argv)):
            if argv[n - 1] in PORT_OPTIONS and service.port is not None and argv[n] == str(service.port):
                argv[n] = str(self.ports[service.name])
        return argv

    def _env(self, service: Service) -> dict[str, str]:
        home = self.folder / "home" / service.name
        home.mkdir(parents=True, exist_ok=True)
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
        return base | {name: self._local(service, value) for name, value in service.environment.items()}

    # -- up and down --------------------------------------------------------------------------------

    def up(self) -> None:
        done: set[str] = set()
        for name in self.compose.services:
            self._start(name, done, ())
        for name, process in self.processes.items():  # up --wait: every health check passes
            if process.poll() is None and self.compose.services[name].healthcheck is not None:
                self._wait_healthy(name)

    def _start(self, name: str, done: set[str], chain: tuple[str, ...]) -> None:
        if name in done or name in self.skip:
            return
        if name in chain:
            raise ComposeError(f"depends_on goes round: {' -> '.join([*chain, name])}")
        service = self.compose.services[name]
        for other, condition in service.depends_on.items():
            if other in self.skip:
                raise ComposeError(f"service {name} depends on {other}, which is not run here")
            self._start(other, done, (*chain, name))
            if condition == "service_healthy":
                self._wait_healthy(other)
        done.add(name)
        if service.command is None:
            raise ComposeError(f"service {name} runs its image's command, which no Dockerfile here says")
        env = self._env(service)
        with (self.folder / f"{name}.log").open("wb") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(self._argv(service, service.command), env=env, cwd=env["HOME"], stdout=log,
                                       stderr=subprocess.STDOUT)  # fmt: skip
        self.processes[name] = process
        if name in self.compose.completing:
            try:
                process.wait(self.timeout)
            except subprocess.TimeoutExpired:
                raise ComposeError(f"service {name} did not finish in {self.timeout} s:\n{self._tail(name)}") from None
            if process.returncode != 0:
                raise ComposeError(f"service {name} exited with {process.returncode}:\n{self._tail(name)}")

    def _wait_healthy(self, name: str) -> None:
        service = self.compose.services[name]
        if service.healthcheck is None:
            raise ComposeError(f"service {name} is waited on as healthy but has no health check")
        argv, env = self._argv(service, service.healthcheck), self._env(service)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise ComposeError(f"service {name} exited with {self.processes[name].returncode}:\n{self._tail(name)}")
            if subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode == 0:
                return
            time.sleep(0.25)
        raise ComposeError(f"service {name} was not healthy in {self.timeout} s:\n{self._tail(name)}")

    def down(self) -> None:
        """Stop what runs as ``docker compose down`` does: a service only once every service that
        depends on it has stopped (the replicas before the object store they fold their journals
        into), each SIGTERMed, then SIGKILLed if it has not exited after a grace period."""
        left = dict(self.processes)
        while left:
            needed = {other for name in left for other in self.compose.services[name].depends_on}
            wave = [name for name in left if name not in needed] or list(left)
            running = [left.pop(name) for name in wave]
            running = [process for process in running if process.poll() is None]
            for process in running:
                process.send_signal(signal.SIGTERM)
            for process in running:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
