"""KnitTrans admission service: engine (pure), planning (pure), service shell, replay and simulator."""
