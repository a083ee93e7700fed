-- Each tenant's tools revision, moved on by every write of its entries, whoever makes it (a
-- trigger, so no writer can forget): a node's periodic re-sync reads one row per tenant and
-- reads again only the tenants whose revision moved, not every entry of every tenant.
CREATE TABLE tool_revisions (
    tenant TEXT PRIMARY KEY,
    revision BIGINT NOT NULL
);

INSERT INTO tool_revisions (tenant, revision) SELECT DISTINCT tenant, 1 FROM tools;

CREATE FUNCTION tools_revised() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- OLD is null for an insert, NEW for a delete; an update moves both tenants on.
    INSERT INTO tool_revisions AS r (tenant, revision)
    SELECT DISTINCT t.tenant, 1 FROM (VALUES (OLD.tenant), (NEW.tenant)) AS t (tenant)
    WHERE t.tenant IS NOT NULL
    ON CONFLICT (tenant) DO UPDATE SET revision = r.revision + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER tools_revised AFTER INSERT OR UPDATE OR DELETE ON tools
    FOR EACH ROW EXECUTE FUNCTION tools_revised();
