"""Frontends lower a model format into ``analyzer.ir.Graph``; passes never see the format."""
