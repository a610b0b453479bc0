"""EdgePipe (Yoon et al. 2022): super neurons (neuron chunks over contiguous layers) per device,
Eq. 2's slot schedule over lossy links.

- scheduler: `scheduler=super_neuron`; roles: one super neuron as a role; plan: the links' PRR,
  the mapping and the slot length a run uses
- partition (Alg. 1), mapping (Alg. 2, the GA), timing (Eq. 2-4, the slot clock), channel (path
  loss and shadowing -> PRR)
- budget: training for a simulated time (Table III); recovery: rtx / ack (Fig. 9(f)); lossy_eval
  and curve: lossy test passes, accuracy over time
"""

from framework.registry import declare
from framework.tracking.objective import declare_metrics
from plugins.schedulers.edgepipe.schema import SuperNeuronConfig

declare("scheduler", "super_neuron", "plugins.schedulers.edgepipe.scheduler:SuperNeuron", schema=SuperNeuronConfig,
        doc="EdgePipe: super neurons (neuron chunks over contiguous layers) per device, Eq. 2 slot schedule, lossy links (Yoon et al. 2022)")

declare_metrics(
    "net/data_per_message", "net/packets_per_message", "net/messages_sent", "plan/messages_per_minibatch", "plan/slot_s", "plan/mean_prr",
    *(f"test/lossy_acc_{k}" for k in ("mean", "std", "min", "frac_below_0.3")), "edgepipe/<rate>/<layer>",
)
