"""Who is calling: tokens, Unix peer credentials, and the principals they map to.

Three kinds of caller hold a token: the master (every scope), named clients (their
configured scopes; stored as SHA-256 hashes only) and sandboxes (a session token per
execution, minted and revoked by `SessionTokens`). Every comparison is constant-time.
This module does not know about connections; `Connection` asks it and keeps the answer.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conduit.core.errors import ConfigError
from conduit.core.redaction import redact
from conduit.daemon.config import SCOPES, AuthConfig, ClientToken

__all__ = [
    "ALL_SCOPES",
    "Authenticator",
    "PeerCredentials",
    "Principal",
    "hash_token",
    "master_token_path",
    "new_token",
    "peer_credentials",
    "resolve_master_token",
]

log = logging.getLogger("conduit.auth")

ALL_SCOPES = frozenset(SCOPES)
_SESSION_SCOPES = frozenset({"tools"})
# 32 bytes = 256 bits: unguessable, and short enough to paste.
_TOKEN_BYTES = 32
_TOKEN_PREFIX = "cdt_"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. `kind` is master, client, peer or session."""

    name: str
    kind: str
    scopes: frozenset[str]
    # The tools this principal may call: every one of these pattern sets must allow a
    # tool (a session holds its request's patterns and its caller's).
    tool_patterns: tuple[tuple[str, ...], ...] = (("*",),)
    # Session principals only: the execution they belong to, and who started it.
    execution_id: str | None = None
    owner: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "scopes": sorted(self.scopes)}


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def new_token() -> str:
    """A fresh random token, URL-safe."""
    return _TOKEN_PREFIX + secrets.token_urlsafe(_TOKEN_BYTES)


def hash_token(token: str) -> str:
    """How client tokens are stored: tokens are random, so a plain SHA-256 suffices."""
    return hashlib.sha256(token.encode()).hexdigest()


def peer_credentials(sock: socket.socket) -> PeerCredentials | None:
    """The connecting process's pid/uid/gid on a Unix socket (Linux SO_PEERCRED)."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCredentials(pid, uid, gid)


def _publish_secret(path: Path, secret: str) -> bool:
    """Write `secret` to `path` unless it exists, so that it appears whole or not at all;
    whether this call wrote it.

    Daemons started together on one state directory (a fleet, a unit restarted while
    the old one stops) race to create it: each writes a private file and links it into
    place, which fails if another's is already there, and then reads that one.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secret + "\n")
        os.link(draft, path)
    except FileExistsError:
        return False  # another daemon's token is in place: it is the one
    finally:
        draft.unlink(missing_ok=True)
    return True


def master_token_path(config: AuthConfig, state_dir: str) -> Path:
    """Where the master token file is: `auth.token_file`, else `<state_dir>/master.token`."""
    return Path(config.token_file) if config.token_file else Path(state_dir) / "master.token"


def resolve_master_token(config: AuthConfig, state_dir: str) -> tuple[str, str]:
    """The master token and where it came from ("config", a file path).

    Order: `auth.token` (which `CONDUIT_TOKEN` sets), `auth.token_file`, then
    `<state_dir>/master.token`, created 0600 with a new token if absent. The token
    itself is never logged; the file path is.
    """
    if config.token:
        return config.token, "config"
    path = master_token_path(config, state_dir)
    if not path.exists() and not config.token_file:
        try:
            created = _publish_secret(path, new_token())
        except OSError as exc:
            raise ConfigError(
                f"cannot create the master token file {path}: {exc.strerror}; make the "
                "state directory writable or set CONDUIT_TOKEN"
            ) from None
        if created:
            log.info("created master token file", extra={"path": str(path)})
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the master token file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise ConfigError(f"the master token in {path} is shorter than 16 characters")
    return token, str(path)


def _client_principal(client: ClientToken) -> Principal:
    return Principal(
        client.name, "client", frozenset(client.scopes), tool_patterns=(client.allowed_tools,)
    )


@dataclass
class Authenticator:
    """Maps presented tokens and peer credentials to principals."""

    master_token: str
    config: AuthConfig
    daemon_uid: int = field(default_factory=os.getuid)
    # Tokens presented that stood for nobody (or for no session, where only sessions count).
    failures: int = 0
    _sessions: dict[str, Principal] = field(default_factory=dict)

    def authenticate_token(self, token: str, *, sessions_only: bool = False) -> Principal | None:
        """The principal a token stands for, or None (counted in `failures`).

        Constant-time per candidate. With `sessions_only` (the sandboxes' socket, where
        nothing but a sandbox should call) any other token stands for nobody.
        """
        principal = self._principal_of(token)
        if principal is not None and sessions_only and principal.kind != "session":
            principal = None
        if principal is None:
            self.failures += 1
        return principal

    def _principal_of(self, token: str) -> Principal | None:
        presented = token.encode()
        if hmac.compare_digest(presented, self.master_token.encode()):
            return Principal("master", "master", ALL_SCOPES)
        digest = hash_token(token)
        for client in self.config.clients:
            if hmac.compare_digest(digest, client.sha256):
                # Only its hash is configured: the token itself is known from now on,
                # whatever its shape, and kept out of the log like the master token.
                redact(token)
                return _client_principal(client)
        return self._session(token)

    def client_principal(self, name: str) -> Principal | None:
        """The principal of the configured client `name`, without its token, or None.

        For callers already trusted as the daemon's own user (`conduit mcp --client`),
        who choose to act with less than the master's reach.
        """
        for client in self.config.clients:
            if client.name == name:
                return _client_principal(client)
        return None

    def _session(self, token: str) -> Principal | None:
        # Session tokens are looked up by hash so timing reveals nothing of a stored one.
        return self._sessions.get(hash_token(token))

    def authenticate_peer(self, creds: PeerCredentials | None) -> Principal | None:
        """Same uid as the daemon: master scopes. A configured uid: client scopes."""
        if creds is None or not self.config.peer_credentials:
            return None
        if creds.uid == self.daemon_uid:
            return Principal(f"uid:{creds.uid}", "peer", ALL_SCOPES)
        if creds.uid in self.config.peer_uids:
            return Principal(
                f"uid:{creds.uid}", "peer", frozenset({"execute", "executions", "tools"})
            )
        return None

    def session_principal(
        self,
        execution_id: str,
        tool_patterns: tuple[tuple[str, ...], ...],
        owner: str | None = None,
    ) -> Principal:
        """Who one execution's sandbox is (started by `owner`): it may list and call
        only tools every set of `tool_patterns` allows, and nothing else."""
        return Principal(
            f"session:{execution_id}",
            "session",
            _SESSION_SCOPES,
            tool_patterns=tool_patterns,
            execution_id=execution_id,
            owner=owner,
        )

    def mint_session(
        self,
        execution_id: str,
        tool_patterns: tuple[tuple[str, ...], ...],
        owner: str | None = None,
    ) -> str:
        """A new session token for one execution's `session_principal`;
        `revoke_session` ends it."""
        token = new_token()
        principal = self.session_principal(execution_id, tool_patterns, owner)
        self._sessions[hash_token(token)] = principal
        return token

    def revoke_session(self, token: str) -> None:
        self._sessions.pop(hash_token(token), None)

    def live_sessions(self) -> int:
        """How many session tokens are valid now (one per running execution)."""
        return len(self._sessions)

    def reconfigure(self, master_token: str, config: AuthConfig) -> None:
        """Apply a reloaded auth section; live sessions stay valid."""
        self.master_token = master_token
        self.config = config
