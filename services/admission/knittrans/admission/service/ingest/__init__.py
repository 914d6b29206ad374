"""Everything the admission service checks before it journals a report or a reservation; nothing here changes state.

- :mod:`.rules`: the rules one reported trajectory must follow, checked per message or over a whole report's
  columns;
- :mod:`.report`: a report checked against the ledger (schema, groups, unit keys, multimodal inputs) and sorted
  into accepted, duplicate and conflicting trajectories (:func:`~.report.classify`);
- :mod:`.reservations`: a ``ReserveUnits`` request checked against itself and the unit index.
"""
