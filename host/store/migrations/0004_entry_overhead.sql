-- Each KV entry and cached result now also costs its tenant 64 bytes (ENTRY_OVERHEAD_BYTES,
-- the row's own bookkeeping): every tenant's bytes counted again by that rule, with writes
-- held off meanwhile so that none is counted twice or lost.
LOCK TABLE kv, cache, usage IN SHARE ROW EXCLUSIVE MODE;
UPDATE usage AS u SET bytes =
    COALESCE((SELECT sum(octet_length(kv.tenant) + 1 + octet_length(kv.tool) + 1
                         + length(kv.key) + length(kv.value) + 64)
              FROM kv WHERE kv.tenant = u.tenant), 0)
  + COALESCE((SELECT sum(octet_length(c.tenant) + 1 + length(c.key) + 8
                         + octet_length(c.value) + 64)
              FROM cache AS c WHERE c.tenant = u.tenant), 0);
