"""OCI image references (docs/images.md): the submit's `image` and what the node pulls. Pure
Python: the web checks a reference at submit, the agent parses the same way before it pulls.

A reference is `HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]`: the host is always written (no implied
Docker Hub), the repository is one or more lowercase path components as the OCI distribution
spec allows, the tag defaults to `latest`, and a digest pins the manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_REFERENCE = 500
HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
PORT = re.compile(r"[0-9]{1,5}")
COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class BadReference(ValueError):
    """Why a reference is not one (the message says what is wrong, for a 400)."""


@dataclass(frozen=True)
class ImageRef:
    host: str  # with its port where one was written: "127.0.0.1:5000"
    repository: str
    tag: str = "latest"
    digest: str = ""  # "sha256:<64 hex>" or ""

    @property
    def hostname(self) -> str:
        return self.host.rsplit(":", 1)[0] if ":" in self.host else self.host

    def pinned(self, digest: str) -> str:
        """The reference a node pulls for this digest (the tag no longer matters)."""
        return f"{self.host}/{self.repository}@{digest}"

    def __str__(self) -> str:
        if self.digest:
            return f"{self.host}/{self.repository}@{self.digest}"
        return f"{self.host}/{self.repository}:{self.tag}"


def parse(reference: object) -> ImageRef:
    if not isinstance(reference, str):
        raise BadReference("must be a string such as registry.example.com/team/image:tag")
    if not reference or len(reference) > MAX_REFERENCE:
        raise BadReference(f"must be 1 to {MAX_REFERENCE} characters")
    rest, digest = reference, ""
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST.fullmatch(digest):
            raise BadReference("the digest must be sha256: and 64 lowercase hex characters")
    host, slash, path = rest.partition("/")
    if not slash or not path:
        raise BadReference("must name the registry host: HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]")
    name, port = host, ""
    if ":" in host:
        name, port = host.rsplit(":", 1)
        if not PORT.fullmatch(port) or not 0 < int(port) < 65536:
            raise BadReference(f"the registry's port {port!r} is not a port number")
    if not HOST.fullmatch(name) or len(name) > 253:
        raise BadReference(f"the registry host {name[:80]!r} is not a host name")
    tag = "latest"
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not TAG.fullmatch(tag):
            raise BadReference(f"the tag {tag[:80]!r} is not a tag (letters, digits, _ . -)")
    for component in path.split("/"):
        if not COMPONENT.fullmatch(component):
            raise BadReference(
                f"the repository part {component[:80]!r} is not one (lowercase letters, digits, "
                "and . _ - between them)"
            )
    return ImageRef(host=host, repository=path, tag=tag, digest=digest)


def allowed(ref: ImageRef, registries: list[str]) -> bool:
    """Whether the reference's registry is one of `registries` (a host, or a host:port)."""
    return ref.host in registries or ref.hostname in registries
