"""Network builders: LTE star, groups, hierarchical group trees."""
