"""The admission service shell: gRPC servicer, journal, assignment streams, releases and metrics.

The decisions themselves come from the pure engine (`knittrans.admission.engine`) and planner
(`knittrans.admission.planning`); this package only translates, journals and delegates.
"""
