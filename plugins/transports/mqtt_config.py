"""The configuration of `transport=mqtt` (conf/transport/mqtt.yaml), and the checks on it that
need no broker."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from framework.config import knobs
from framework.config.knobs import Range, knob, knob_factory
from framework.config.schemas import TransportConfig
from framework.errors import ConfigError
from plugins.transports.mqtt_frame import MACS


@dataclass
class BrokerConfig:
    host: Optional[str] = knob(None, "the broker's host; unset with port unset: a private broker (spawn=auto; plugins/transports/broker.py)")
    port: Optional[int] = knob(None, "the broker's TCP port", range=Range(0, 65535, integer=True, null=True, note="a TCP port; null or 0 = a private broker on a free port"))
    spawn: str = knob("auto", "auto (start a private broker unless host or port names one) | always | never (plugins/transports/broker.py)", choices=("auto", "always", "never"))
    binary: str = knob("mosquitto", "the broker program a run starts")
    persistence: bool = knob(False, "a spawned broker keeps sessions across its own restart")


@dataclass
class MqttConfig(TransportConfig):
    """Role messages through an MQTT broker (mosquitto): chunked, ordered, authenticated, QoS 1."""

    name: str = "mqtt"
    broker: BrokerConfig = knob_factory(BrokerConfig, "where the roles meet")
    topic_prefix: str = knob("pipelab", "the first level of every topic: one level, without / + #")
    chunk_bytes: int = knob(1 << 20, "frames above this are split (1024 to 2**30)")
    max_inflight: int = knob(16, "chunks published and not yet acknowledged (back-pressure)", range=Range(1, integer=True))
    max_message_bytes: int = knob(256 << 20, "larger messages are refused (both ends; 1 to 2**40)")
    # a wait of 0 would spin: every reconnection attempt at once
    partial_timeout_s: float = knob(120.0, "a half-received message that gets no chunk for this long is dropped", range=Range(0, low_open=True, note="seconds a half-received message waits for its next chunk"))
    mac: str = knob("gmac", "how frames are authenticated (mqtt_frame.py): gmac | poly1305 (CPUs without AES instructions) | hmac-sha256", choices=MACS)
    credentials_file: Optional[str] = knob(None, "a role started by hand: where its run credentials are")
    insecure: bool = knob(False, "allow a broker off this machine without TLS (everything crosses in clear)")
    keepalive_s: int = knob(5, "a dead peer is noticed within ~1.5x this (its last will)", range=Range(1, integer=True, note="seconds"))
    connect_timeout_s: float = knob(15.0, "seconds to wait for the broker", range=Range(0, low_open=True, note="seconds to wait for the broker"))
    reconnect_initial_s: float = knob(0.1, "seconds before the first reconnection attempt; doubles up to reconnect_max_s", range=Range(0, low_open=True, note="seconds before the first reconnection attempt; doubles up to reconnect_max_s"))
    reconnect_max_s: float = knob(5.0, "the longest wait between reconnection attempts", range=Range(0, low_open=True, note="the longest wait between reconnection attempts"))
    reconnect_timeout_s: float = knob(60.0, "give up after this long without a connection", range=Range(0, low_open=True, note="seconds without a broker before the run fails"))
    username: Optional[str] = knob(None, "a broker the run did not start (the password: better $PIPELAB_MQTT_PASSWORD)")
    password: Optional[str] = knob(None, "the broker password (better $PIPELAB_MQTT_PASSWORD)")
    tls: bool = knob(False, "connect over TLS")
    tls_ca_certs: Optional[str] = knob(None, "TLS: the CA certificates that sign the broker's")
    tls_certfile: Optional[str] = knob(None, "TLS: this client's certificate")
    tls_keyfile: Optional[str] = knob(None, "TLS: this client's key")
    tls_insecure: bool = knob(False, "accept a certificate whose host name does not match")


def validate_config(cfg) -> None:
    """What a transport checks when it is made (also from code, not only a composed config):
    every knob in its schema's range and choices, and what those cannot say."""
    knobs.check(cfg, MqttConfig, "transport")
    if not 1024 <= cfg.chunk_bytes <= 1 << 30:
        raise ConfigError("transport.chunk_bytes", f"must be between 1024 and 2**30, got {cfg.chunk_bytes}")
    if "/" in cfg.topic_prefix or "+" in cfg.topic_prefix or "#" in cfg.topic_prefix or not cfg.topic_prefix:
        raise ConfigError("transport.topic_prefix", f"{cfg.topic_prefix!r} must be one non-empty topic level without / + #")
    if (cfg.password is not None) and cfg.username is None:
        raise ConfigError("transport.username", "a password needs a username")
    if not 1 <= cfg.max_message_bytes <= 1 << 40:
        raise ConfigError("transport.max_message_bytes", f"must be between 1 and 2**40, got {cfg.max_message_bytes}")
    if cfg.reconnect_max_s < cfg.reconnect_initial_s:
        raise ConfigError("transport.reconnect_max_s", f"the longest wait between reconnection attempts must be >= transport.reconnect_initial_s={cfg.reconnect_initial_s:g}, the first; got {cfg.reconnect_max_s:g}")


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
