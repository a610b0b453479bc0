"""Config and validation: the typed schemas (`schemas`), where configs come from (`dirs`), a
knob's doc, range and choices (`knobs`), the checks before a run (`validate`, `validate_knobs`),
and the one-line errors and `--help` a user reads (`input_errors`, `group_options`, `knob_help`).
Nothing here imports torch: `--help` and a bad command line answer before it loads."""
