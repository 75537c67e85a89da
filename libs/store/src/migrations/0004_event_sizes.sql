-- Pages of events are cut by bytes as well as by count (PROTOCOL.md: at most
-- 4 MiB a page), so that no reader loads a page of huge events at once. The
-- size of each event's payload as JSON text is recorded when it is written;
-- rows written before this migration have none, and are measured when read.
ALTER TABLE events ADD COLUMN size_bytes integer;
