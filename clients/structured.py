"""The `structured` workload: every request asks for JSON valid against one order schema.

The schema is the kind that jump-forward decoding was made for: long fixed keys, enums and
punctuation the grammar forces, around a few free values (numbers, a short string, a boolean).
An engine with jump-forward appends the forced runs without decoding them; one without decodes
every token, so `doppelchip simulate --workload structured` shows the difference.
"""

from __future__ import annotations

import json

ORDER_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "customer_account_identifier": {"type": "integer"},
        "shipping_destination_country": {"enum": ["United States", "Germany", "Japan"]},
        "order_priority_classification": {"enum": ["standard", "expedited", "overnight"]},
        "line_items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "product_sku_reference": {"type": "string", "maxLength": 12},
                    "quantity_ordered": {"type": "integer", "minimum": 1},
                },
                "required": ["product_sku_reference", "quantity_ordered"],
                "additionalProperties": False,
            },
        },
        "requires_signature_on_delivery": {"type": "boolean"},
    },
    "required": [
        "customer_account_identifier", "shipping_destination_country",
        "order_priority_classification", "line_items", "requires_signature_on_delivery",
    ],
    "additionalProperties": False,
}

ORDER_SCHEMA_TEXT = json.dumps(ORDER_SCHEMA)


def structured_constraint() -> tuple[str, str]:
    """(kind, text) of the workload's constraint, as a `Conversation` carries it."""
    return ("json_schema", ORDER_SCHEMA_TEXT)
