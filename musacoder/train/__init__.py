"""Training: the record format and mixing (`data`), multi-task SFT (`sft`), diversity-preserving RFT (`rft`,
`diversity`). Heavy libraries (trl, peft, datasets, datasketch) are imported by the modules that need them, so
`musacoder.train.data` loads with the core dependencies alone."""
