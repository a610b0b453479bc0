"""EdgePipe's link recovery variants (paper Fig. 9(f); notes 2.11 and 8 item 18): what a sender
does about a lost message. EdgePipe proper does nothing (`none`).

- `rtx`: every message is sent `rtx_copies` times back to back; the receiver keeps one. A message
  is lost only if every copy is: delivery 1 - (1 - p)^copies, `copies` transmissions each.
- `ack`: stop-and-wait ARQ within the message's slot, as an 802.15.4 MAC does it: the receiver
  acknowledges every data frame it gets with an ACK frame on the reverse link, itself lossy
  (PRR of b -> a); the sender retransmits until an ACK comes back, at most `ack_max_retries`
  times (the notes' default 3; the paper gives no cap). A received frame whose ACK is lost is
  sent again (a duplicate the receiver drops). Delivery is again 1 - (1 - p)^(1 + retries): the
  last attempt is made whenever every earlier data frame was lost.

Transmission factors (summary.json `edgepipe.transmissions`): `data_per_message` counts data
frames only (1.0 on lossless links, r-TX's 2.0 exactly); `packets_per_message` adds the ACK
frames (2.0 on lossless links). Decision: the study's gate "ACK factor in [1.5, 3]" (paper 2.16)
reads `packets_per_message`, as the notes recommend ("count data+ACK packets"); with data frames
alone the factor is ~1.2-1.5 on the calibrated channel, since the GA maps the busy pairs onto the
good links.

ACK runs in the link model (framework.cluster.Link.schedule): a role sends each message once
with `ctx.send(..., reliable=False, retries=ack_max_retries)`; the link draws each data frame's
loss and each ACK's (the reverse link's loss, PRR of b -> a) from its own generator and retransmits
after `retransmit_timeout_s`, which the scheduler sets to the ACK wait (`ack_wait_s`: the frame's
and the ACK's propagation and the ACK's airtime). The timeline labels every attempt `send`, `lost`
or `dup`; the factors come from its counts on the EdgePipe links and the roles' counts of distinct
messages (`summarize`). ACK frames (11 bytes on 802.15.4) are counted, not carried: one per data
frame that arrived; the roles never see them, they are the MAC's.
"""

from __future__ import annotations

import numpy as np

ACK_BYTES = 11  # an 802.15.4 ACK frame: 5-byte MPDU + 6-byte PHY header


def max_transmissions(cfg) -> int:
    """Data frames per message at most: 1, r-TX's copies, or 1 + ACK's retries. The slot is sized
    for this many (Eq. 4's worst case: every retransmission fits in its slot)."""
    if cfg.recovery == "rtx":
        return int(cfg.rtx_copies)
    if cfg.recovery == "ack":
        return 1 + int(cfg.ack_max_retries)
    return 1


def delivery_prr(prr: np.ndarray, attempts: int) -> np.ndarray:
    """The chance a message gets through with up to `attempts` data frames (r-TX and ACK alike)."""
    return 1.0 - (1.0 - np.asarray(prr, dtype=float)) ** attempts


def ack_wait_s(cluster, a: str, b: str) -> float:
    """How long device a's radio waits for the ACK of a frame to b before it sends again: the
    frame's propagation, the ACK's airtime on the reverse link and its way back."""
    fwd, back = cluster.link(a, b), cluster.link(b, a)
    return fwd.cfg.latency_s + back.tx_time(ACK_BYTES, 0.0) + back.cfg.latency_s


def summarize(links: dict[str, dict], messages: int, recovery: str) -> dict:
    """Transmissions per distinct message: `links` are the timeline's stats of the EdgePipe links
    (every transmission, lost ones and duplicates counted), `messages` the distinct messages the
    roles sent over them. With ACK also the fraction of messages delivered (without ACK the
    sender never learns it)."""
    data = sum(st["messages"] for st in links.values())
    lost = sum(st["lost"] for st in links.values())
    dups = sum(st["duplicates"] for st in links.values())
    acks = data - lost if recovery == "ack" else 0  # every frame that arrives is acknowledged
    delivered = data - lost - dups  # one first copy per delivered message (with ACK)
    return {"recovery": recovery, "messages": messages, "data_frames": data, "ack_frames": acks,
            "data_per_message": data / messages if messages else 1.0, "packets_per_message": (data + acks) / messages if messages else 1.0,
            "delivered_frac": (delivered / messages if messages else 1.0) if recovery == "ack" else None}  # only ACK's sender knows
