"""kubeforge.api"""
