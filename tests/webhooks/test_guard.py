"""The SSRF guard's address rules, without any network: which addresses are refused, what the
operator's allow-list lets in, and a bad allow-list stopping the settings from loading."""

import ipaddress
import os
import socket
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.webhooks import guard

REFUSED = [
    "127.0.0.1", "127.8.9.10", "0.0.0.0", "10.0.0.1", "10.255.255.254", "172.16.0.1", "172.31.255.1",
    "192.168.1.1", "169.254.169.254", "169.254.0.1", "100.100.100.200", "100.64.0.1", "192.0.0.192",
    "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.2.1",
    "::", "::1", "fd00:ec2::254", "fc00::1", "fe80::1", "ff02::1", "fec0::1", "2001:db8::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a00:1", "2002:a00:1::1",
]  # fmt: skip
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address):
    assert guard.refusal(ipaddress.ip_address(address), ()) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert guard.refusal(ipaddress.ip_address(address), ()) is None


def test_an_allow_listed_network_lets_in_its_addresses_and_only_those():
    allow = guard.parse_networks("127.0.0.0/8, fd12:3456::/32")
    for address in ("127.0.0.1", "::ffff:127.0.0.1", "fd12:3456::9"):
        assert guard.refusal(ipaddress.ip_address(address), allow) is None
    for address in ("10.0.0.1", "169.254.169.254", "::1", "fd00:ec2::254"):
        assert guard.refusal(ipaddress.ip_address(address), allow) is not None


def test_a_bad_allow_list_names_the_setting():
    with pytest.raises(
        ImproperlyConfigured, match="GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS.*'10.0.0.0/33'"
    ):
        guard.parse_networks("127.0.0.0/8,10.0.0.0/33")
    assert guard.parse_networks(" 10.1.2.3 ,") == (ipaddress.ip_network("10.1.2.3/32"),)


def test_settings_refuse_to_load_with_a_bad_allow_list():
    env = dict(os.environ, GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS="localnet")
    run = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode != 0
    assert (
        "ImproperlyConfigured" in run.stderr
        and "GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS: 'localnet'" in run.stderr
    )


def fake_resolver(table):
    """Names under .example from the table; any other name (Redis's own) as before. The patch
    is on the socket module, which everything in the process shares."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if not str(host).endswith(".example"):
            return real(host, port, *args, **kwargs)
        if host not in table:
            raise socket.gaierror("no such name")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in table[host]]  # fmt: skip

    return getaddrinfo


def test_names_are_checked_on_every_address_they_resolve_to(monkeypatch, settings):
    settings.WEBHOOK_ALLOW_NETWORKS = ()
    monkeypatch.setattr(guard.socket, "getaddrinfo", fake_resolver({
        "rebind.example": ["127.0.0.1"], "mixed.example": ["93.184.216.34", "10.0.0.7"],
        "meta.example": ["fd00:ec2::254"], "public.example": ["93.184.216.34"],
    }))  # fmt: skip
    for url in (
        "http://rebind.example/",
        "https://mixed.example/x",
        "http://meta.example:8080/",
        "http://nx.example/",
    ):
        with pytest.raises(guard.WebhookRefused):
            guard.checked_address(url)
    target, address = guard.checked_address("https://public.example/hook?x=1")
    assert (target.host, target.port, target.path, str(address)) == (
        "public.example",
        443,
        "/hook?x=1",
        "93.184.216.34",
    )
    assert target.origin == "https://public.example:443"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://93.184.216.34/",
        "http://user:pw@93.184.216.34/",
        "http:///nohost",
        "http://93.184.216.34:99999/",
    ],
)
def test_urls_that_are_not_plain_http_are_refused(url, settings):
    settings.WEBHOOK_ALLOW_NETWORKS = ()
    with pytest.raises(guard.WebhookRefused):
        guard.checked_address(url)
