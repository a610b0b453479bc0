"""Pipeline-parallel training: the scheduler a schedule plugin subclasses (`scheduler`), the
action vocabulary and schedules as data (`schedule`), the stage role (`stage`), the plan and what
it costs (`plan`, `cost`, `timing`, `partition`), and what happens between epochs (`repartition`,
`epoch_end`)."""
