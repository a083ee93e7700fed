"""Reads a JSON list of schemas on stdin and prints, as a JSON list, what the official
Anthropic SDK makes of each for strict tool use (`anthropic.transform_schema`)."""

import json
import sys

from anthropic import transform_schema

json.dump([transform_schema(schema) for schema in json.load(sys.stdin)], sys.stdout)
