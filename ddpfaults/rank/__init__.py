"""rank"""
