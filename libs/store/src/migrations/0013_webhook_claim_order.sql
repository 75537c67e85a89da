-- The webhook senders' claim walks the pending deliveries oldest first and
-- stops once it has enough heads of their (conversation, endpoint) queues
-- (`WebhookDeliveryRepository.claimDue`). Without this index it had to find
-- the head of every queue and sort them all on each claim, a cost that grew
-- with the backlog (quadratic when the planner had no statistics): at a few
-- hundred deliveries a second the claims alone saturated Postgres and the
-- backlog fed itself. Only pending rows are in it, so it stays as small as
-- the backlog.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (seq) WHERE status = 'pending';

-- A delivery is written once and updated twice: claimed (claim,
-- claimed_until: no indexed column, so a HOT update when its page has room)
-- and then its outcome (status: a new version in the indexes anyway). Pages
-- filled to the brim left no room for the claim, which then wrote a new entry
-- in each of the table's indexes; a fifth of each page is kept for it. Pages
-- written from now on; older ones are already delivered.
ALTER TABLE webhook_deliveries SET (fillfactor = 80);
