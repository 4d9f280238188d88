"""A policy in which a team (ada, ben) may write, erase and read in tenant shop, and an outsider
(olga) may only read what is allowed to her; and the tags a team store writes with."""

TEAM_POLICY = """\
g, user:ada, group:team, shop
g, user:ben, group:team, shop
g, user:olga, group:outsiders, shop
p, group:team, shop, classification:internal, read, allow
p, group:outsiders, shop, classification:internal, read, allow
p, group:team, shop, label:pricing, read, allow
p, group:team, shop, ingest, execute, allow
p, group:team, shop, forget, execute, allow
"""
TEAM_TAGS = {"allow": ["group:team"], "classification": "internal"}

