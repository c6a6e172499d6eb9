"""lcmoe.diagnose"""
