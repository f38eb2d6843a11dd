"""What a user asks for and the rules that check it (``rules``), the limits and capacity those
rules read, and the workload rows (``store``)."""
