"""fednet.learning"""
