-- A put at a tenant's data quota removes that tenant's expired results: found by tenant and
-- expiry, without reading the tenant's other results.
CREATE INDEX cache_tenant_expiry ON cache (tenant, expires_at_ms);
