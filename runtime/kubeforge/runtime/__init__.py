"""kubeforge.runtime"""
