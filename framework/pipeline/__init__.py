"""Pipeline-parallel training: the scheduler a schedule plugin subclasses (`scheduler`), the
action vocabulary and schedules as data (`schedule`), the stage role (`stage`), the plan and what
it costs (`plan`, `cost`, `timing`, `partition`), and what happens between epochs (`repartition`,
`epoch_end`).

Schedules as torch.distributed.pipelining writes them, `(stage, op, micro-batch)` per device
(issue 48; the stages do not run them yet): the actions (`actions`), every built-in schedule's
generator (`schedules`), sends and receives (`lowering`), the validator (`validate`), torch's CSV
format (`schedule_csv`: `load_csv`, `dump_csv`) and bubble and in-flight activations on given
durations (`bubble`). Like every room's, this `__init__` imports nothing: importing a room costs
nothing until a module of it is used."""
