"""Where a webhook may be sent: the SSRF guard.

A webhook URL is the tenant's, so the platform must not become the tenant's way into the
platform's own network: its loopback ports (web, Redis, Flower), the private networks its nodes
and databases sit on, and the cloud metadata services that hand out credentials. An address is
refused unless it is a public unicast address, or an operator allow-listed a network covering it
(`GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS`, for self-hosted receivers on a private network).

The check is made on the addresses the name resolves to *at send time*, and the connection is
then made to exactly the checked address (see `apps.webhooks.sender`): a name that resolved to a
public address when the webhook was made may resolve to 127.0.0.1 later (DNS rebinding).
No Django at import time beyond the exception type: settings.py parses the allow-list with it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_SETTING = "GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS"

# Named on top of `is_global`, so that a Python whose table differs (they have changed between
# releases) still refuses these, and so the documentation can list them.
REFUSED_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network", 0.0.0.0 reaches loopback on Linux
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT; Alibaba's metadata is 100.100.100.200
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local; AWS/GCP/Azure metadata is 169.254.169.254
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255
        "::/128",
        "::1/128",
        "::ffff:0:0/96",  # IPv4-mapped: checked again as the IPv4 address it carries
        "64:ff9b::/96",  # NAT64: would reach the IPv4 address it carries
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",  # IETF protocol assignments, Teredo
        "2001:db8::/32",
        "2002::/16",  # 6to4: carries an IPv4 address
        "fc00::/7",  # unique local (ULA); AWS's IPv6 metadata is fd00:ec2::254
        "fe80::/10",  # link-local
        "fec0::/10",  # old site-local
        "ff00::/8",  # multicast
    )
)


class WebhookRefused(ValueError):
    """The URL or the address it resolves to may not receive webhooks. The message is ours
    (never a receiver's words), safe to show the operator who made the webhook."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # the name as written (Host header and TLS SNI), brackets stripped
    port: int
    path: str  # path and query, "/" at least
    origin: str  # scheme://host:port, the receiver a concurrency slot is counted against


def parse_networks(value: str | None, *, name: str = ALLOW_SETTING) -> tuple[Network, ...]:
    """Comma-separated CIDRs (a bare address is its own /32 or /128)."""
    networks = []
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not a network (use CIDRs like 10.1.0.0/16)"
            ) from None
    return tuple(networks)


def allowed_networks() -> tuple[Network, ...]:
    from django.conf import settings

    value = getattr(settings, "WEBHOOK_ALLOW_NETWORKS", ())
    if isinstance(value, str):  # an override in a test or local settings may give the raw string
        return parse_networks(value)
    return tuple(ipaddress.ip_network(n, strict=False) if isinstance(n, str) else n for n in value)


def refusal(address: Address, allow: tuple[Network, ...]) -> str | None:
    """Why the address may not be sent to, or None when it may."""
    candidates = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    if any(a.version == n.version and a in n for a in candidates for n in allow):
        return None
    for a in candidates:
        if (
            any(a.version == n.version and a in n for n in REFUSED_NETWORKS)
            or not a.is_global
            or a.is_multicast
        ):
            return f"address {address} is not a public address (loopback, private, link-local, metadata or reserved)"
    return None


def target_of(url: str) -> Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookRefused("not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused("not an http(s) URL with a host")
    if parts.username or parts.password:
        raise WebhookRefused("credentials in the URL are not allowed (the signature authenticates)")
    port = port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return Target(parts.scheme, host, port, path, f"{parts.scheme}://{shown}:{port}")


def resolve(target: Target) -> list[Address]:
    """Every address the host resolves to now (an IP literal is itself)."""
    try:
        return [ipaddress.ip_address(target.host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise WebhookRefused(f"the name {target.host!r} does not resolve") from None
    seen: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in seen:
            seen.append(address)
    return seen


def checked_address(url: str) -> tuple[Target, Address]:
    """The target and the one address to connect to, or WebhookRefused. Every address the name
    resolves to must pass: a name with one public and one private address is refused, since
    which one a client would pick is up to the resolver."""
    target = target_of(url)
    addresses = resolve(target)
    if not addresses:
        raise WebhookRefused(f"the name {target.host!r} does not resolve")
    allow = allowed_networks()
    for address in addresses:
        reason = refusal(address, allow)
        if reason:
            raise WebhookRefused(f"{reason}; an operator can allow its network in {ALLOW_SETTING}")
    first = addresses[0]
    if isinstance(first, ipaddress.IPv6Address) and first.ipv4_mapped is not None:
        first = first.ipv4_mapped  # connect over IPv4 to what the mapped address means
    return target, first
