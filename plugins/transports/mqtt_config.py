"""The configuration of `transport=mqtt` (conf/transport/mqtt.yaml), and the checks on it that
need no broker."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional

from framework.config import TransportConfig
from framework.errors import ConfigError
from framework.validate_numbers import Range
from plugins.transports.mqtt_frame import MACS


@dataclass
class BrokerConfig:
    host: Optional[str] = None  # unset with port unset: a private broker (spawn=auto); see broker.py
    port: Optional[int] = None
    spawn: str = "auto"  # auto | always | never (see plugins/transports/broker.py)
    binary: str = "mosquitto"
    persistence: bool = False  # a spawned broker keeps sessions across its own restart


@dataclass
class MqttConfig(TransportConfig):
    """Role messages through an MQTT broker (mosquitto): chunked, ordered, authenticated, QoS 1."""

    name: str = "mqtt"
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic_prefix: str = "pipelab"
    chunk_bytes: int = 1 << 20  # frames above this are split
    max_inflight: int = 16  # chunks published and not yet acknowledged (back-pressure)
    max_message_bytes: int = 256 << 20  # larger messages are refused (both ends)
    partial_timeout_s: float = 120.0  # a half-received message that gets no chunk for this long is dropped
    mac: str = "gmac"  # gmac | poly1305 | hmac-sha256: how frames are authenticated (mqtt_frame.py; poly1305 on CPUs without AES instructions)
    credentials_file: Optional[str] = None  # a role started by hand: where its run credentials are
    insecure: bool = False  # allow a broker off this machine without TLS (everything crosses in clear)
    keepalive_s: int = 5  # a dead peer is noticed within ~1.5x this (its last will)
    connect_timeout_s: float = 15.0
    reconnect_initial_s: float = 0.1
    reconnect_max_s: float = 5.0
    reconnect_timeout_s: float = 60.0  # give up after this long without a connection
    username: Optional[str] = None  # a broker the run did not start (the password: better $PIPELAB_MQTT_PASSWORD)
    password: Optional[str] = None
    tls: bool = False
    tls_ca_certs: Optional[str] = None
    tls_certfile: Optional[str] = None
    tls_keyfile: Optional[str] = None
    tls_insecure: bool = False  # accept a certificate whose host name does not match


# the timeouts and waits, in seconds (a wait of 0 would spin: every reconnection attempt at once)
SECONDS = {
    "connect_timeout_s": Range(0, low_open=True, note="seconds to wait for the broker"),
    "reconnect_initial_s": Range(0, low_open=True, note="seconds before the first reconnection attempt; doubles up to reconnect_max_s"),
    "reconnect_max_s": Range(0, low_open=True, note="the longest wait between reconnection attempts"),
    "reconnect_timeout_s": Range(0, low_open=True, note="seconds without a broker before the run fails"),
    "partial_timeout_s": Range(0, low_open=True, note="seconds a half-received message waits for its next chunk"),
}


def validate_config(cfg) -> None:
    if not 1024 <= cfg.chunk_bytes <= 1 << 30:
        raise ConfigError("transport.chunk_bytes", f"must be between 1024 and 2**30, got {cfg.chunk_bytes}")
    if cfg.max_inflight < 1:
        raise ConfigError("transport.max_inflight", f"must be >= 1, got {cfg.max_inflight}")
    if cfg.keepalive_s < 1:
        raise ConfigError("transport.keepalive_s", f"must be >= 1 s, got {cfg.keepalive_s}")
    if "/" in cfg.topic_prefix or "+" in cfg.topic_prefix or "#" in cfg.topic_prefix or not cfg.topic_prefix:
        raise ConfigError("transport.topic_prefix", f"{cfg.topic_prefix!r} must be one non-empty topic level without / + #")
    if (cfg.password is not None) and cfg.username is None:
        raise ConfigError("transport.username", "a password needs a username")
    if not 1 <= cfg.max_message_bytes <= 1 << 40:
        raise ConfigError("transport.max_message_bytes", f"must be between 1 and 2**40, got {cfg.max_message_bytes}")
    if cfg.mac not in MACS:
        raise ConfigError("transport.mac", f"{cfg.mac!r} is not a choice; choices: {', '.join(MACS)}")
    for key, r in SECONDS.items():
        why = r.problem(getattr(cfg, key))
        if why:
            raise ConfigError(f"transport.{key}", why)
    if cfg.reconnect_max_s < cfg.reconnect_initial_s:
        raise ConfigError("transport.reconnect_max_s", f"the longest wait between reconnection attempts must be >= transport.reconnect_initial_s={cfg.reconnect_initial_s:g}, the first; got {cfg.reconnect_max_s:g}")
    port = cfg.broker.port
    if port is not None and not 0 <= int(port) <= 65535:
        raise ConfigError("transport.broker.port", f"must be a TCP port, 1-65535 (null or 0: a private broker on a free port), got {port}")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: somewhere on the network


def check_link(cfg, host: str) -> None:
    """A broker off this machine without TLS sees and can change everything: only if asked."""
    if not cfg.tls and not cfg.insecure and not is_loopback(host):
        raise ConfigError("transport.insecure", f"the MQTT broker {host} is not on this machine and transport.tls=false: every message "
                          "(and the broker password) would cross the network in clear. Use TLS (transport.tls=true, transport.tls_ca_certs=...) "
                          "or say transport.insecure=true")
