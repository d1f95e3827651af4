"""Reading histories after the fact: fetch and export them, replay them offline, explain a divergence, trace."""
