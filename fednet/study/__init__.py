"""fednet.study"""
