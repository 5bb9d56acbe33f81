"""Training data and its hygiene, shared by bench, train and synth: the record schema (`records`), a task's
computation as a canonical op graph (`opgraph`), the decontamination detectors (`decontam`), the keys tasks are
grouped by (`keys`) and code similarity (`diversity`)."""
