-- Version 3: the sandbox protections in force for a run (held through every segment of it).
ALTER TABLE runs ADD COLUMN protections VARCHAR[];
