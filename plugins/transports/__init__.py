"""Network transports for the real runtimes (`runtime=local`, `runtime=remote`), declared
(framework.registry.declare)."""

from framework.registry import declare
from plugins.transports.mqtt_config import MqttConfig

declare("transport", "mqtt", "plugins.transports.mqtt:build_mqtt", schema=MqttConfig,
        doc="Role messages through an MQTT broker (mosquitto): chunked, ordered, authenticated, QoS 1.")
