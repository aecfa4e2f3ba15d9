"""The pure rules a receipt states and verify recomputes, each under its algorithm id."""
